"""What the CAIS merge unit costs (docs/switch-cost.md): its arrays from CACTI
(:mod:`cais.cost.cacti`), its adders from published figures, and a clocked pipeline,
per switch port and per chip, at CACTI's node (22 nm) and scaled by bit cell to the
paper's (TSMC 12 nm, §V-D) and to 7 and 5 nm.

The arrays of one port's unit (paper §III-A.2; docs/switch-cost.md has the reasons):

- ``cam``: the CAM Lookup Table, one tag per entry: the line address (``ADDRESS_BITS``
  less the line offset) and the request type (load or reduction), searched once per
  request;
- ``data``: the Content Array's data: ``entries`` lines of ``line_bytes`` (the cached
  load data or the partial sum; twice that with FP32 accumulation), read or written one
  line at a time, on one read-write port (a reduction's read-modify-write takes two
  accesses) or on one read and one write port (1R1W: one access slot);
- ``meta``: the Merging Table's state per entry: the session state (2 bits), the count
  of merged requests (up to ``gpus``) and one slot per waiting requester (the other
  ``gpus - 1`` GPUs) with its port and its NVLink transaction tag, for the deferred
  responses.

**Scaling by bit cell.** CACTI 7 stops at 22 nm. Below it an array's area is CACTI's
22 nm area times the ratio of the nodes' published 6T bit cells (:data:`CELL_UM2`);
dynamic energy and leakage times its square root (a cell's width: capacitance and
leaking width scale with length, not area), the supply held. Times are CACTI's 22 nm
times, not scaled: a 16 nm-class FinFET is faster, so they are conservative, and the
rate comes from a stated switch clock (:data:`CLOCK_GHZ`), each array taking the whole
cycles its CACTI cycle time needs.

**The datapath** (:func:`evaluate`): ``line_bytes / 2`` BF16 adders per port (one per
lane of a line), or FP32 adders with FP32 partial sums (:data:`ADDERS`, Horowitz, ISSCC
2014, 45 nm, scaled to the node by bit cell for area and by its square root and the
supply squared for energy); the pipeline's stages as stated cycle counts
(:data:`ADD_CYCLES`, :data:`CONTROL_CYCLES`, the project's choice) at the clock.

``cais/data/cacti/merge_unit.json`` is the stored CACTI run of every array every design
needs (:func:`stored`); :func:`cost` reruns CACTI where it is found."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from cais.cost import cacti as C

#: physical address bits a request carries: the project's choice (the hand-written area
#: model's; the paper gives no address width); one bit more or less moves the CAM by ~2 %
ADDRESS_BITS = 48
#: NVLink transaction tag a deferred response must echo (bits; the project's assumption:
#: 1,024 outstanding per port)
TXN_TAG_BITS = 10
#: high-density 6T SRAM bit cell (um^2) by node, each with its source
CELL_UM2: dict[int, tuple[float, str]] = {
    45: (0.346, "Intel 45 nm, IEDM 2007 (Mistry et al.): the node of Horowitz's adder figures"),
    22: (0.0707, "CACTI 7's 22 nm cell, 146 F^2 (its tech_params/22nm.dat)"),
    12: (0.070, "TSMC 16FF+ HD, ISSCC 2014; TSMC's 12 nm is a 16 nm-class node with the same cell"),
    7: (0.027, "TSMC N7 HD, IEDM 2016"),
    5: (0.021, "TSMC N5 HD, IEDM 2019 (NVSwitch 3's TSMC 4N is an N5-class node)"),
}
#: the nodes the report covers; the verdict's is the paper's (§V-D: TSMC 12 nm)
NODES_NM = (22, 12, 7, 5)
VERDICT_NM = 12
#: FP adders (Horowitz, "Computing's energy problem", ISSCC 2014, 45 nm at 0.9 V): pJ per add and
#: um^2. The BF16 adder takes the FP16 adder's figures (BF16's 8-bit significand is narrower than
#: FP16's 11, its exponent wider: about the same adder)
ADDERS = {"bf16": (0.4, 1360.0, "an FP16 add"), "fp32": (0.9, 4184.0, "an FP32 add")}
ADDER_SOURCE = "Horowitz, ISSCC 2014 (45 nm, 0.9 V)"
#: the supply Horowitz's figures are at and the one assumed at 16 nm and below (V)
V_45NM, V_FINFET = 0.9, 0.8
#: pipeline cycles of the adder (BF16 or FP32 accumulation) and of the control / output stage:
#: the project's choice, stated
ADD_CYCLES = {"bf16": 2, "fp32": 3}
CONTROL_CYCLES = 1
#: the merge unit's clock (GHz): the project's assumption (NVSwitch's clock is not published;
#: switch pipelines run at about 1-2 GHz), with the range the report shows
CLOCK_GHZ = 1.5
CLOCK_RANGE_GHZ = (1.0, 2.0)
#: per-link tables: a port's table split over its links, address-hashed (DGX H100: 4 or 5 of a
#: GPU's links reach each chip; 4 taken)
LINK_TABLES = 4
#: the stored run
FIXTURE = Path(__file__).resolve().parent.parent / "data" / "cacti" / "merge_unit.json"


@dataclass(frozen=True)
class Design:
    """One design of a port's merge unit: ``cells`` (CACTI's ITRS device types, for
    cells and periphery), ``data_ports`` (``1rw``: a reduction's read-modify-write takes
    two access slots; ``1r1w``: one), ``accumulate`` (``bf16`` or ``fp32`` partial sums,
    twice the data bytes), ``tables`` (1, or one per link, address-hashed, each with
    ``entries / tables`` lines and its own adders), at ``clock_GHz`` and ``node_nm``."""

    cells: str = "itrs-hp"
    data_ports: str = "1rw"
    accumulate: str = "bf16"
    tables: int = 1
    clock_GHz: float = CLOCK_GHZ
    node_nm: int = VERDICT_NM

    @property
    def label(self) -> str:
        t = f", {self.tables} per-link tables" if self.tables > 1 else ""
        return f"{self.cells}, {self.data_ports}, {self.accumulate}{t}, {self.clock_GHz:g} GHz"

    @property
    def red_accesses(self) -> int:
        """Access slots a reduction's line takes: its read and its write."""
        return 2 if self.data_ports == "1rw" else 1


#: the designs the report shows: the base (one-port data array, HP cells, BF16, the stated
#: clock), the clock's range, LSTP cells, a 1R1W data array, FP32 accumulation, per-link tables
DESIGNS = (Design(), Design(clock_GHz=CLOCK_RANGE_GHZ[0]), Design(clock_GHz=CLOCK_RANGE_GHZ[1]),
           Design(cells="itrs-lstp"), Design(data_ports="1r1w"), Design(accumulate="fp32"),
           Design(tables=LINK_TABLES))


def tag_bits(line_bytes: int = 128) -> int:
    """CAM tag bits: the line address and the request type."""
    return ADDRESS_BITS - int(math.log2(line_bytes)) + 1


def meta_bits(gpus: int = 8) -> int:
    """Merging-table bits per entry: state, count, and the waiting requesters' slots."""
    count = math.ceil(math.log2(gpus + 1))
    slot = math.ceil(math.log2(gpus)) + TXN_TAG_BITS
    return 2 + count + (gpus - 1) * slot


def array_key(name: str, tables: int = 1, ports: str = "1rw", accumulate: str = "bf16") -> str:
    """The stored run's key of one array: ``cam/t1``, ``meta/t4``, ``data/t1/1r1w/fp32``."""
    return f"{name}/t{tables}" + (f"/{ports}/{accumulate}" if name == "data" else "")


def arrays(entries: int = 320, line_bytes: int = 128, gpus: int = 8, tables: int = 1, ports: str = "1rw",
           accumulate: str = "bf16", cells: str = "itrs-hp") -> list[C.Array]:
    """One table's arrays (module docstring); a port has ``tables`` of them."""
    n = entries // tables
    tag_B = math.ceil(tag_bits(line_bytes) / 8)
    meta_B = math.ceil(meta_bits(gpus) / 8)
    data_B = line_bytes * (2 if accumulate == "fp32" else 1)
    return [C.Array(array_key("cam", tables), "cam", n * tag_B, tag_B, cells=cells),
            C.Array(array_key("data", tables, ports, accumulate), "ram", n * data_B, data_B, cells=cells, ports=ports),
            C.Array(array_key("meta", tables), "ram", n * meta_B, meta_B, cells=cells)]


def _all_arrays(entries: int, line_bytes: int, gpus: int, cells: str) -> list[C.Array]:
    seen: dict[str, C.Array] = {}
    for d in DESIGNS:
        for a in arrays(entries, line_bytes, gpus, d.tables, d.data_ports, d.accumulate, cells):
            seen[a.name] = a
    return list(seen.values())


def run(entries: int = 320, line_bytes: int = 128, gpus: int = 8, binary: Path | None = None) -> dict[str, Any]:
    """A fresh CACTI run at 22 nm of every array :data:`DESIGNS` need, for both device
    types, in the stored run's form; RuntimeError where no CACTI binary is found."""
    binary = binary or C.find_cacti()
    if binary is None:
        raise RuntimeError("no CACTI binary: run scripts/build_cacti.sh or set CAIS_CACTI")
    return {"tool": f"CACTI 7 from {C.SDIST['name']} {C.SDIST['version']} (sdist sha256 {C.SDIST['sha256'][:12]}...)",
            "node_nm": C.CACTI_MIN_NM, "entries": entries, "line_bytes": line_bytes, "gpus": gpus,
            "address_bits": ADDRESS_BITS, "tag_bits": tag_bits(line_bytes), "meta_bits": meta_bits(gpus),
            "cells": {cells: {a.name: {"kind": a.kind, "bytes": a.nbytes, "block_bytes": a.block_bytes,
                                       "ports": a.ports, **C.run_array(a, C.CACTI_MIN_NM, binary)}
                              for a in _all_arrays(entries, line_bytes, gpus, cells)}
                      for cells in C.CELLS}}


@cache
def stored() -> dict[str, Any]:
    """The stored run (``cais/data/cacti/merge_unit.json``)."""
    return json.loads(FIXTURE.read_text())


def cost(entries: int = 320, line_bytes: int = 128, gpus: int = 8, fresh: bool = True) -> tuple[dict[str, Any], str]:
    """(a run in :func:`run`'s form, where it came from): CACTI's where it is found and
    ``fresh``, else the stored run (which must be of the same sizes)."""
    if fresh and C.find_cacti() is not None:
        return run(entries, line_bytes, gpus), "a CACTI run made now (it equals the stored run where the sizes do)"
    s = stored()
    if (s["entries"], s["line_bytes"], s["gpus"]) != (entries, line_bytes, gpus):
        raise ValueError(f"the stored CACTI run is of {s['entries']} x {s['line_bytes']} B, {s['gpus']} GPUs; "
                         "run scripts/build_cacti.sh to run CACTI for other sizes")
    return s, f"the stored CACTI run ({FIXTURE.name}; CACTI is not installed here)"


def cell_ratio(node_nm: int, of: int = C.CACTI_MIN_NM) -> float:
    """The bit-cell area at ``node_nm`` over that at ``of`` (:data:`CELL_UM2`)."""
    if node_nm not in CELL_UM2:
        raise ValueError(f"no bit cell for {node_nm} nm: one of {', '.join(str(n) for n in CELL_UM2)}")
    return CELL_UM2[node_nm][0] / CELL_UM2[of][0]


def scale(fig: dict[str, Any], node_nm: int) -> dict[str, float]:
    """CACTI's 22 nm figures of one array at ``node_nm`` (module docstring's rule):
    area x the cell ratio, energies and leakage x its square root, times as CACTI's."""
    r = cell_ratio(node_nm)
    out = {k: float(v) for k, v in fig.items() if isinstance(v, float)}
    out["area_mm2"] *= r
    for k in ("read_nJ", "write_nJ", "search_nJ", "leakage_mW"):
        out[k] *= r ** 0.5
    return out


def adder(accumulate: str, node_nm: int) -> dict[str, float]:
    """One lane's adder at ``node_nm``: ``pJ`` per add and ``um2``, Horowitz's 45 nm
    figures scaled by bit cell (area) and its square root times the supply squared
    (energy)."""
    pJ, um2, _ = ADDERS[accumulate]
    r = cell_ratio(node_nm, of=45)
    return {"pJ": pJ * r ** 0.5 * (V_FINFET / V_45NM) ** 2, "um2": um2 * r}


def cycles(ns: float, clock_GHz: float) -> int:
    """Whole cycles ``ns`` takes at ``clock_GHz`` (at least one)."""
    return max(1, math.ceil(ns * clock_GHz - 1e-9))


def evaluate(r: dict[str, Any], d: Design) -> dict[str, Any]:
    """Design ``d``'s figures per port: its arrays' area, leakage and cycle counts, its
    adders' area and energy, the pipeline's latency (ns: the reduction's stages, tag
    match, state, data read, add, control), the access slots per ns it starts
    (``lookups_per_ns``: clock x tables / the slowest array's cycles per access), the
    slots a reduction takes (``red_accesses``) and a line lookup's energy: ``pJ_max`` (a
    reduction's: search, state read and write, line read and write, the adders) and
    ``pJ_min`` (a search and the state's read and write)."""
    figs = {}
    for a in arrays(r["entries"], r["line_bytes"], r["gpus"], d.tables, d.data_ports, d.accumulate, d.cells):
        name = a.name.split("/")[0]
        figs[name] = scale(r["cells"][d.cells][a.name], d.node_nm)
    lanes = r["line_bytes"] // 2
    add = adder(d.accumulate, d.node_nm)
    clk = d.clock_GHz
    per_access = max(cycles(f["cycle_ns"], clk) for f in figs.values())
    lat_cycles = (cycles(figs["cam"]["access_ns"], clk) + cycles(figs["meta"]["access_ns"], clk)
                  + cycles(figs["data"]["access_ns"], clk) + ADD_CYCLES[d.accumulate] + CONTROL_CYCLES)
    pj_min = 1e3 * (figs["cam"]["search_nJ"] + figs["meta"]["read_nJ"] + figs["meta"]["write_nJ"])
    return {"design": d.label, **asdict(d),
            "arrays_mm2": d.tables * sum(f["area_mm2"] for f in figs.values()),
            "adders_mm2": d.tables * lanes * add["um2"] / 1e6,
            "leakage_mW": d.tables * sum(f["leakage_mW"] for f in figs.values()),
            "data_cycle_ns": figs["data"]["cycle_ns"], "cycles_per_access": per_access,
            "latency_cycles": lat_cycles, "latency_ns": lat_cycles / clk,
            "lookups_per_ns": d.tables * clk / per_access, "red_accesses": d.red_accesses,
            "pJ_min": pj_min,
            "pJ_max": pj_min + 1e3 * (figs["data"]["read_nJ"] + figs["data"]["write_nJ"]) + lanes * add["pJ"]}


def table(r: dict[str, Any], nodes: tuple[int, ...] = NODES_NM, ports_per_chip: int | None = None) -> pd.DataFrame:
    """Per device type, node and array of the base design (and the port's and the
    chip's totals): area (mm^2), read, write and search energy per access (pJ), leakage
    (mW), access and cycle time (ns, CACTI's 22 nm at every node)."""
    ports = ports_per_chip or r["gpus"]
    rows = []
    for cells in C.CELLS:
        for n in nodes:
            src = "CACTI" if n == C.CACTI_MIN_NM else f"CACTI 22 nm x cell {cell_ratio(n):.3f}"
            figs = {a.name.split("/")[0]: scale(r["cells"][cells][a.name], n)
                    for a in arrays(r["entries"], r["line_bytes"], r["gpus"], cells=cells)}
            for name, f in figs.items():
                rows.append({"cells": cells, "node_nm": n, "source": src, "array": name,
                             "area_mm2": f["area_mm2"], "read_pJ": 1e3 * f["read_nJ"], "write_pJ": 1e3 * f["write_nJ"],
                             "search_pJ": 1e3 * f["search_nJ"], "leakage_mW": f["leakage_mW"],
                             "access_ns": f["access_ns"], "cycle_ns": f["cycle_ns"]})
            port = {"cells": cells, "node_nm": n, "source": src, "array": "port",
                    "area_mm2": sum(f["area_mm2"] for f in figs.values()),
                    "read_pJ": 1e3 * sum(f["read_nJ"] for f in figs.values()),
                    "write_pJ": 1e3 * sum(f["write_nJ"] for f in figs.values()),
                    "search_pJ": 1e3 * figs["cam"]["search_nJ"],
                    "leakage_mW": sum(f["leakage_mW"] for f in figs.values()),
                    "access_ns": figs["cam"]["access_ns"] + figs["data"]["access_ns"],
                    "cycle_ns": max(f["cycle_ns"] for f in figs.values())}
            rows.append(port)
            rows.append({**port, "array": f"chip ({ports} ports)", "area_mm2": ports * port["area_mm2"],
                         "leakage_mW": ports * port["leakage_mW"]})
    return pd.DataFrame(rows)


def designs(r: dict[str, Any], nodes: tuple[int, ...] = NODES_NM, ports_per_chip: int | None = None) -> pd.DataFrame:
    """Every design of :data:`DESIGNS` at the verdict's node, and the base design at
    the other nodes: per chip, the arrays' and the adders' area (mm^2, apart and
    summed) and the leakage (mW); per port, the latency, the access slots per ns, the
    slots a reduction takes and a lookup's energy (pJ, least and most)."""
    ports = ports_per_chip or r["gpus"]
    ds = list(DESIGNS) + [replace(DESIGNS[0], node_nm=n) for n in nodes if n != VERDICT_NM]
    rows = []
    for d in ds:
        e = evaluate(r, d)
        rows.append({"node_nm": d.node_nm, "design": e["design"], "chip_arrays_mm2": ports * e["arrays_mm2"],
                     "chip_adders_mm2": ports * e["adders_mm2"],
                     "chip_mm2": ports * (e["arrays_mm2"] + e["adders_mm2"]),
                     "chip_leakage_mW": ports * e["leakage_mW"], "cycles_per_access": e["cycles_per_access"],
                     "latency_ns": e["latency_ns"], "lookups_per_ns": e["lookups_per_ns"],
                     "red_accesses": e["red_accesses"], "pJ_min": e["pJ_min"], "pJ_max": e["pJ_max"]})
    return pd.DataFrame(rows)


def preset_timing(node: str, cells: str = "itrs-hp", clock_GHz: float = CLOCK_GHZ, data_ports: str = "1rw",
                  accumulate: str = "bf16", tables: int = 1) -> dict[str, float | int]:
    """``switch.merge.latency_ns``, ``lookups_per_ns`` and ``red_accesses`` of a design
    from the stored run at ``node`` ("22nm", "12nm", "7nm" or "5nm"): what
    ``switch.merge.cacti_node`` sets (the stored run, so a config means the same on
    every machine)."""
    nm = int(node.removesuffix("nm"))
    if nm not in NODES_NM:
        raise ValueError(f"switch.merge.cacti_node {node!r}: one of {', '.join(f'{n}nm' for n in NODES_NM)}")
    if tables not in (1, LINK_TABLES):
        raise ValueError(f"switch.merge.tables {tables}: 1 or {LINK_TABLES} (the stored CACTI runs' sizes)")
    e = evaluate(stored(), Design(cells, data_ports, accumulate, tables, clock_GHz, nm))
    return {"latency_ns": round(e["latency_ns"], 4), "lookups_per_ns": round(e["lookups_per_ns"], 4),
            "red_accesses": e["red_accesses"]}
