"""Closed-form SRAM area of the CAIS merge unit (per switch chip) and of the GPU's
TB-group synchroniser, against table size, from published SRAM bit-cell figures."""

from __future__ import annotations

import pandas as pd

from cais.reproduce import paper as P

#: high-density 6T bit cell (um^2) per TSMC node, as published
BITCELL_UM2 = {"16/12 nm": 0.070, "N5": 0.021, "N3E": 0.021, "N2": 0.0175}
#: macro density of N3E HD SRAM, Mib/mm^2 (IEDM 2022 via WikiChip): fixes the array efficiency
N3E_MIB_PER_MM2 = 31.8
ARRAY_EFFICIENCY = N3E_MIB_PER_MM2 * 2 ** 20 / (1e6 / BITCELL_UM2["N3E"])  # bits in cells / bits per mm^2
CAM_CELL_FACTOR = 2.0  # a CAM bit cell against an SRAM one (compare logic), a common rule of thumb
TAG_BITS = 48 + 2  # address (48 b) and request type per entry
COUNT_BITS = 4  # arrivals seen (up to 8 GPUs) per entry
PORTS_PER_CHIP = 8  # GPU-facing ports of one NVSwitch chip in a DGX-H100 (one per GPU)
SYNC_ENTRY_BITS = 32  # group id (16 b), arrivals (8 b), state (8 b)

SOURCES = ("bit cells: TSMC 16FF+/12 nm HD 0.070 um^2 (ISSCC 2014), N5 and N3E 0.021 um^2, N3B 0.0199 um^2 "
           "(IEDM 2022, via WikiChip/Tom's Hardware), N2 0.0175 um^2 (IEDM 2024); N3E macro density 31.8 Mib/mm^2 "
           f"fixes the array efficiency at {ARRAY_EFFICIENCY:.2f} for every node. The paper's figures (12 nm): "
           f"{P.AREA_SWITCH_MM2:.2f} mm^2 per switch, {P.AREA_SYNC_MM2} mm^2 per GPU die.")


def merge_unit_mm2(table_kB: float, node: str, line_bytes: int = 128) -> float:
    """SRAM + CAM area (mm^2) of one switch chip's merge tables: ``PORTS_PER_CHIP`` ports
    of ``table_kB`` (kB = 1000 B) of data lines, each line with its CAM tag and count."""
    lines = table_kB * 1000 / line_bytes
    bits = lines * (line_bytes * 8 + COUNT_BITS) + lines * TAG_BITS * CAM_CELL_FACTOR
    return PORTS_PER_CHIP * bits * BITCELL_UM2[node] / ARRAY_EFFICIENCY / 1e6


def sync_mm2(entries: int, node: str) -> float:
    """Area (mm^2) of a synchroniser table of ``entries`` entries on one GPU die."""
    return entries * SYNC_ENTRY_BITS * BITCELL_UM2[node] / ARRAY_EFFICIENCY / 1e6


def area_table(sizes_kB: tuple[float, ...] = (10.24, 20.48, 40.96, 81.92, 163.84, 327.68, 655.36),
               nodes: tuple[str, ...] = ("16/12 nm", "N5", "N2")) -> pd.DataFrame:
    """Per node and per-port table size: merge-unit area per switch chip and the
    synchroniser's area (256 entries) per GPU die."""
    return pd.DataFrame([{"node": n, "table_kB": s, "switch_mm2": merge_unit_mm2(s, n), "sync_256_mm2": sync_mm2(256, n)}
                         for n in nodes for s in sizes_kB])
