"""What ``st.mc.dyn``'s dynamic multicast group table costs (docs/moe.md, "In-switch
expert parallelism"; what it needs per routing: :mod:`cais.experiments.ep_table`).

The table at CAIS's budget (40 KB per port) is, as an array, the merge unit's
Content Array (40,960 B read in 128 B lines, one read-write port): its CACTI figures
(the stored run, ``cais/data/cacti/merge_unit.json``), scaled to the node by bit cell as
:mod:`cais.cost.merge_unit` scales them. A lookup reads one line (the entries packed in
it). Its rate is the clock over the whole cycles the array's cycle time takes; a port
needs at most one lookup per packet at its links' rate (the break-even rate)."""

from __future__ import annotations

from typing import Any

from cais.cost import merge_unit as M

#: CAIS's merge table per port (320 x 128 B), the budget the table is set against
CAIS_TABLE_BYTES = 320 * 128


def lookup_cost(node_nm: int = M.VERDICT_NM, clock_GHz: float = M.CLOCK_GHZ, cells: str = "itrs-hp") -> dict[str, float]:
    """Per port, the 40 KB table's area (mm^2), leakage (mW), a lookup's energy (pJ: one
    line read), its latency (ns: the array's access time in whole cycles) and the
    lookups it starts per ns."""
    r = M.stored()
    fig = M.scale(r["cells"][cells]["data/t1/1rw/bf16"], node_nm)
    per = M.cycles(fig["cycle_ns"], clock_GHz)
    return {"node_nm": node_nm, "clock_GHz": clock_GHz, "bytes": CAIS_TABLE_BYTES, "area_mm2": fig["area_mm2"],
            "leakage_mW": fig["leakage_mW"], "lookup_pJ": 1e3 * fig["read_nJ"],
            "latency_ns": M.cycles(fig["access_ns"], clock_GHz) / clock_GHz,
            "lookups_per_ns": clock_GHz / per}


def packets_per_ns(port_GBps: float, max_payload_bytes: int) -> float:
    """A port's peak packet rate: its links' payload rate over a full packet's payload
    (the most lookups it can ask for: one per packet)."""
    return port_GBps / max_payload_bytes
