"""What the CAIS merge unit costs, from CACTI (:mod:`cais.cost.cacti`): its arrays per
switch port and per chip, at CACTI's smallest node (22 nm) and scaled to the paper's
(TSMC 12 nm, §V-D) and to 7 nm.

The arrays of one port's unit (paper §III-A.2; docs/switch-cost.md has the reasons):

- ``cam``: the CAM Lookup Table, one tag per entry: the line address (``ADDRESS_BITS``
  less the line offset) and the request type (load or reduction), searched once per
  request;
- ``data``: the Content Array's data: ``entries`` lines of ``line_bytes`` (the cached
  load data or the partial sum), read or written one line at a time;
- ``meta``: the Merging Table's state per entry: the session state (2 bits), the count
  of merged requests (up to ``gpus``) and one slot per waiting requester (the other
  ``gpus - 1`` GPUs) with its port and its NVLink transaction tag, for the deferred
  responses.

Below 22 nm the figures are scaled as hwcomponents-cacti scales them (its
``_interp_tech_node``): area and times linearly in the node, dynamic energy with its
square root, leakage with its square root times 0.79 (FinFET). That is a rule, not a
CACTI run; the report says so beside every scaled number.

``cais/data/cacti/merge_unit.json`` is one stored run (:func:`stored`); :func:`cost`
reruns CACTI where it is found and uses the stored run where not."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from cais.cost import cacti as C

#: physical address bits a request carries (the hand-written area model's 48)
ADDRESS_BITS = 48
#: NVLink transaction tag a deferred response must echo (bits; an assumption: 1,024 outstanding per port)
TXN_TAG_BITS = 10
#: the nodes the report covers: CACTI's own 22 nm, the paper's 12 nm (§V-D), 7 nm
NODES_NM = (22, 12, 7)
#: the stored run
FIXTURE = Path(__file__).resolve().parent.parent / "data" / "cacti" / "merge_unit.json"


def tag_bits(line_bytes: int = 128) -> int:
    """CAM tag bits: the line address and the request type."""
    return ADDRESS_BITS - int(math.log2(line_bytes)) + 1


def meta_bits(gpus: int = 8) -> int:
    """Merging-table bits per entry: state, count, and the waiting requesters' slots."""
    count = math.ceil(math.log2(gpus + 1))
    slot = math.ceil(math.log2(gpus)) + TXN_TAG_BITS
    return 2 + count + (gpus - 1) * slot


def arrays(entries: int = 320, line_bytes: int = 128, gpus: int = 8) -> list[C.Array]:
    """One port's arrays (module docstring)."""
    tag_B = math.ceil(tag_bits(line_bytes) / 8)
    meta_B = math.ceil(meta_bits(gpus) / 8)
    return [C.Array("cam", "cam", entries * tag_B, tag_B), C.Array("data", "ram", entries * line_bytes, line_bytes),
            C.Array("meta", "ram", entries * meta_B, meta_B)]


def run(entries: int = 320, line_bytes: int = 128, gpus: int = 8, binary: Path | None = None) -> dict[str, Any]:
    """A fresh CACTI run of one port's arrays at 22 nm, in the stored run's form;
    RuntimeError where no CACTI binary is found."""
    binary = binary or C.find_cacti()
    if binary is None:
        raise RuntimeError("no CACTI binary: run scripts/build_cacti.sh or set CAIS_CACTI")
    return {"tool": f"CACTI 7 from {C.SDIST['name']} {C.SDIST['version']} (sdist sha256 {C.SDIST['sha256'][:12]}...)",
            "node_nm": C.CACTI_MIN_NM, "entries": entries, "line_bytes": line_bytes, "gpus": gpus,
            "address_bits": ADDRESS_BITS, "tag_bits": tag_bits(line_bytes), "meta_bits": meta_bits(gpus),
            "arrays": {a.name: {"kind": a.kind, "bytes": a.nbytes, "block_bytes": a.block_bytes,
                                **C.run_array(a, C.CACTI_MIN_NM, binary)}
                       for a in arrays(entries, line_bytes, gpus)}}


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


def scale(fig: dict[str, float], node_nm: float) -> dict[str, float]:
    """CACTI's 22 nm figures of one array at ``node_nm`` (module docstring's rule)."""
    if node_nm >= C.CACTI_MIN_NM:
        return dict(fig)
    s = node_nm / C.CACTI_MIN_NM
    out = dict(fig)
    for k in ("area_mm2", "access_ns", "cycle_ns"):
        out[k] = fig[k] * s
    for k in ("read_nJ", "write_nJ", "search_nJ"):
        out[k] = fig[k] * s ** 0.5
    out["leakage_mW"] = fig["leakage_mW"] * s ** 0.5 * 0.79
    return out


def table(r: dict[str, Any], nodes: tuple[int, ...] = NODES_NM, ports_per_chip: int | None = None) -> pd.DataFrame:
    """Per node and array (and the port's and the chip's totals): area (mm^2), read,
    write and search energy per access (pJ), leakage (mW), access and cycle time (ns)."""
    ports = ports_per_chip or r["gpus"]
    rows = []
    for n in nodes:
        src = "CACTI" if n >= C.CACTI_MIN_NM else f"CACTI {C.CACTI_MIN_NM} nm, scaled"
        figs = {name: scale({k: v for k, v in a.items() if isinstance(v, float)}, n) for name, a in r["arrays"].items()}
        for name, f in figs.items():
            rows.append({"node_nm": n, "source": src, "array": name, "bytes": r["arrays"][name]["bytes"],
                         "area_mm2": f["area_mm2"], "read_pJ": 1e3 * f["read_nJ"], "write_pJ": 1e3 * f["write_nJ"],
                         "search_pJ": 1e3 * f["search_nJ"], "leakage_mW": f["leakage_mW"],
                         "access_ns": f["access_ns"], "cycle_ns": f["cycle_ns"]})
        t = timing(r, n)
        port = {"node_nm": n, "source": src, "array": "port",
                "bytes": sum(a["bytes"] for a in r["arrays"].values()),
                "area_mm2": sum(f["area_mm2"] for f in figs.values()),
                "read_pJ": 1e3 * sum(f["read_nJ"] for f in figs.values()),
                "write_pJ": 1e3 * sum(f["write_nJ"] for f in figs.values()),
                "search_pJ": 1e3 * figs["cam"]["search_nJ"],
                "leakage_mW": sum(f["leakage_mW"] for f in figs.values()),
                "access_ns": t["latency_ns"], "cycle_ns": 1 / t["lookups_per_ns"]}
        rows.append(port)
        rows.append({**port, "array": f"chip ({ports} ports)", "bytes": ports * port["bytes"],
                     "area_mm2": ports * port["area_mm2"], "leakage_mW": ports * port["leakage_mW"]})
    return pd.DataFrame(rows)


def timing(r: dict[str, Any], node_nm: float) -> dict[str, float]:
    """What a lookup costs one port's unit at ``node_nm``: ``latency_ns`` (a CAM search,
    then the data line's access, in series), ``lookups_per_ns`` (one lookup per cycle
    of the slowest array: the arrays are pipelined, one bank each) and ``access_pJ``
    (a request's energy, an upper bound: a CAM search, the entry's state read and
    written, and its data line read and written, a reduction's read-modify-write)."""
    f = {name: scale({k: v for k, v in a.items() if isinstance(v, float)}, node_nm) for name, a in r["arrays"].items()}
    return {"latency_ns": f["cam"]["access_ns"] + f["data"]["access_ns"],
            "lookups_per_ns": 1 / max(a["cycle_ns"] for a in f.values()),
            "access_pJ": 1e3 * (f["cam"]["search_nJ"] + f["meta"]["read_nJ"] + f["meta"]["write_nJ"]
                                + f["data"]["read_nJ"] + f["data"]["write_nJ"])}


def preset_timing(node: str) -> dict[str, float]:
    """``switch.merge.latency_ns`` and ``lookups_per_ns`` from the stored run at
    ``node`` ("22nm", "12nm" or "7nm"): what ``switch.merge.cacti_node`` sets (the
    stored run, so a config means the same on every machine)."""
    nm = int(node.removesuffix("nm"))
    if nm not in NODES_NM:
        raise ValueError(f"switch.merge.cacti_node {node!r}: one of {', '.join(f'{n}nm' for n in NODES_NM)}")
    t = timing(stored(), nm)
    return {"latency_ns": round(t["latency_ns"], 4), "lookups_per_ns": round(t["lookups_per_ns"], 4)}
