"""The in-switch EP ladder and its switch table's cost (docs/moe.md, "In-switch expert
parallelism: results"), from real runs.

    python scripts/ep_switch_ladder.py --run [--quick]   # simulate the grid, store it
    python scripts/ep_switch_ladder.py --world gh200-nvl32  # rerun one world's rungs, keep the rest
    python scripts/ep_switch_ladder.py --kernels ep-switch ep-switch-red  # rerun these rungs (every world)
    python scripts/ep_switch_ladder.py --modes           # run the layer schemes per mode, store them
    python scripts/ep_switch_ladder.py --sensitivity     # rerun the one-knob changes, links-bind rungs, break-even
    python scripts/ep_switch_ladder.py                   # print the section from the stored runs
    python scripts/ep_switch_ladder.py --write-doc       # put it between the markers of docs/moe.md

The runs are stored in ``src/cais/data/ep_switch/ladder.json``, each rung with the commit
it ran at; the section is made from them alone, and tests/test_ep_switch.py checks that the
page holds it and reruns one stored rung. ``--quick`` keeps the dgx-h100 grid only.

A partial rerun (``--world``, ``--kernels``, ``--sensitivity``) keeps the other stored runs
with their commits and runs on the settings the store was made on (``made_on`` in the
file: config overrides and EP constants; none: the current ones), so that what it keeps and
what it reruns compare; ``--kernels`` limits it to those rungs (and, with
``--sensitivity``, to the one-knob, links-bind and break-even runs of those kernels), as
when a change can move only some of them. ``--run`` remakes everything on the current
settings."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from cais.config import SystemConfig, apply_overrides, load_system
from cais.cost.group_table import CAIS_TABLE_BYTES, lookup_cost, packets_per_ns
from cais.experiments.ep_table import table_need
from cais.experiments.ep_ladder import LADDER, MoeBlock, run_rung
from cais.kernels.ep_common import EpConstants, ep_constants
from cais.kernels.ep_switch import TILE_ROWS

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "src" / "cais" / "data" / "ep_switch" / "ladder.json"
MODES_STORE = STORE.with_name("modes.json")
DOC = ROOT / "docs" / "moe.md"
BEGIN, END = "<!-- ep-switch:begin -->", "<!-- ep-switch:end -->"

#: (world label, system, gpus, experts, token counts, routings, rungs)
GRID = (
    ("dgx-h100", "dgx-h100", 8, 256, (128, 1024, 4096), ("uniform", "powerlaw", "lognormal"), LADDER),
    ("gh200-nvl32", "gh200-nvl32", 32, 256, (128,), ("uniform", "powerlaw", "lognormal"),
     ("deepep", "ep-switch-sw", "ep-switch-mcast", "ep-switch-red", "ep-switch")),
)
#: where the low-latency kernels run (DeepEP's are built for decode batches)
LL_MAX_TOKENS = 1024
#: the lookup latencies (ns) the break-even sweep tries, at one point
LOOKUP_NS = (0.0, 500.0, 2000.0, 8000.0)
BREAK_EVEN_POINT = ("dgx-h100", 1024, "uniform")
#: the table-need grid: (ranks, experts), token counts, routings, seeds
NEED = (((8, 256), (32, 256), (72, 288)), (128, 1024, 8192), ("uniform", "powerlaw", "lognormal"))
NEED_SEEDS = {8: 100, 32: 20, 72: 10}


def system(name: str, gpus: int, sets: dict[str, str] | None = None) -> SystemConfig:
    """Preset ``name`` at ``gpus`` GPUs, with the config overrides ``sets`` (:func:`made_on`)."""
    cfg = apply_overrides(load_system(name), sets) if sets else load_system(name)
    return cfg if cfg.gpus == gpus else cfg.with_overrides(gpus=gpus)


def made_on(data: dict | None) -> tuple[dict[str, str], EpConstants]:
    """The config overrides and EP constants the stored runs ``data`` were made on (its
    ``made_on``; none, or no data: the current ones)."""
    made = (data or {}).get("made_on") or {}
    return dict(made.get("sets", {})), ep_constants().model_copy(update=made.get("ep_constants", {}))


def stamp() -> dict[str, str]:
    """The commit and date a run is made at, as each stored run records them."""
    return {"commit": commit(), "date": time.strftime("%Y-%m-%d")}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def world_rungs(world: tuple, made: dict | None = None, kernels: tuple[str, ...] | None = None) -> list[dict]:
    """One GRID world's rungs (``kernels``: only these), each stamped with the commit and
    date it ran at, on the settings of ``made`` (stored runs whose ``made_on`` to keep;
    none: the current ones)."""
    label, name, gpus, experts, tokens, routings, rungs = world
    sets, consts = made_on(made)
    cfg = system(name, gpus, sets)
    at = stamp()
    out = []
    for T in tokens:
        for rout in routings:
            for k in rungs:
                if k == "deepep-ll" and T > LL_MAX_TOKENS or kernels is not None and k not in kernels:
                    continue
                r = run_rung(cfg, k, MoeBlock(T, experts=experts), rout, constants=consts)
                out.append({"world": label, "system": name, "gpus": gpus, **asdict(r), **at})
                print(label, T, rout, k, f"{r.time_us:.1f} us", f"{r.wall_s:.1f} s", flush=True)
    return out


def rerun_world(data: dict, label: str | None, kernels: tuple[str, ...] | None = None) -> dict:
    """``data`` with the rungs of GRID's world ``label`` (None: every world), or only its
    ``kernels``' rungs, run again on the settings ``data`` was made on; the others kept
    with their commits, and the stored rungs of worlds no longer in GRID dropped."""
    worlds = {w[0]: w for w in GRID}
    if label is not None and label not in worlds:
        raise SystemExit(f"--world: unknown '{label}'; valid: {', '.join(worlds)}")
    again = [label] if label is not None else list(worlds)

    def rerun(r: dict) -> bool:
        return r["world"] in again and (kernels is None or r["kernel"] in kernels)
    kept = [r for r in data["rungs"] if r["world"] in worlds and not rerun(r)]
    fresh = [r for w in again for r in world_rungs(worlds[w], data, kernels)]

    def key(r: dict) -> tuple[int, ...]:
        w = worlds[r["world"]]
        return (list(worlds).index(r["world"]), w[4].index(r["tokens"]), w[5].index(r["routing"]),
                w[6].index(r["kernel"]))
    return {**data, "rungs": sorted(kept + fresh, key=key)}


def run(quick: bool) -> dict:
    """The grid and the table's need, on the current settings (the break-even sweep, the
    one-knob changes and the links-bind rungs: :func:`rerun_sensitivity`)."""
    out: dict = {**stamp(), "rungs": [], "need": []}
    for w in GRID[:1] if quick else GRID:
        out["rungs"] += world_rungs(w)
    (ranks_experts, tokens, routings) = NEED
    for ranks, experts in ranks_experts:
        for T in tokens:
            for rout in routings:
                bt = -(-TILE_ROWS * experts // (8 * ranks))  # the fused pipeline's block (kernels/ep_switch.py)
                out["need"] += table_need(rout, ranks, T, experts, 8, NEED_SEEDS[ranks], bt)
                print("need", ranks, T, rout, flush=True)
    return out


#: one-knob changes of ep-switch at one point, against its default: (label, knobs)
SENSITIVITY = (("64-token blocks", {"block_tokens": 64}), ("one combine row in flight per sender", {"red_window_bytes": 14336}),
               ("a 256 B group table (64 entries of 4 B)", {"table_bytes": 256}))
SENSITIVITY_POINT = ("dgx-h100", 1024, "uniform")


def break_even_runs(made: dict | None) -> tuple[list[dict], dict]:
    """ep-switch at each lookup latency of LOOKUP_NS and ep-switch-red (no multicast) at
    BREAK_EVEN_POINT, on the settings of ``made`` (as :func:`world_rungs`)."""
    world, T, rout = BREAK_EVEN_POINT
    sets, consts = made_on(made)
    cfg, at = system(world, 8, sets), stamp()
    out = []
    for ns in LOOKUP_NS:
        r = run_rung(cfg, "ep-switch", MoeBlock(T), rout, constants=consts, lookup_ns=ns)
        out.append({"lookup_ns": ns, "time_us": r.time_us, **at})
        print("break-even", f"{ns:g} ns", f"{r.time_us:.1f} us", flush=True)
    ref = run_rung(cfg, "ep-switch-red", MoeBlock(T), rout, constants=consts)
    return out, {"kernel": "ep-switch-red", "time_us": ref.time_us, **at}


def sensitivity(made: dict | None = None) -> list[dict]:
    """ep-switch at SENSITIVITY_POINT by default and with each one-knob change, on the
    settings of ``made`` (as :func:`world_rungs`)."""
    world, T, rout = SENSITIVITY_POINT
    sets, consts = made_on(made)
    cfg, at = system(world, 8, sets), stamp()
    base = run_rung(cfg, "ep-switch", MoeBlock(T), rout, constants=consts)
    out = [{"label": "default", "time_us": base.time_us, "group_peak": base.group_peak, "overflows": base.overflows,
            "merged": base.merged, "evicted": base.evicted, **at}]
    for label, knobs in SENSITIVITY:
        r = run_rung(cfg, "ep-switch", MoeBlock(T), rout, constants=consts, **knobs)
        out.append({"label": label, "time_us": r.time_us, "group_peak": r.group_peak, "overflows": r.overflows,
                    "merged": r.merged, "evicted": r.evicted, **at})
        print("sensitivity", label, f"{r.time_us:.1f} us", flush=True)
    return out


#: the rungs run again with the SM copy loop unbounded, so that the links bind (the fitted
#: rate stands for a loss on the NVLink path the fabric model lacks; docs/moe.md, calibration)
LINKS_BIND = ("deepep", "ep-switch-sw", "ep-switch-mcast", "ep-switch-red", "ep-switch-unfused", "ep-switch")
UNBOUNDED_GBPS = 1000.0


def links_bind(made: dict | None = None, kernels: tuple[str, ...] | None = None) -> list[dict]:
    """The LINKS_BIND rungs (``kernels``: only these) with the SM copy loop unbounded, on
    the settings of ``made`` (as :func:`world_rungs`)."""
    world, T0, rout = SENSITIVITY_POINT
    sets, consts = made_on(made)
    cfg, at = system(world, 8, sets), stamp()
    fast = consts.model_copy(update={"sm_copy_GBps": UNBOUNDED_GBPS})
    out = []
    for T in (T0, 4096):
        for k in LINKS_BIND:
            if kernels is not None and k not in kernels:
                continue
            r = run_rung(cfg, k, MoeBlock(T), rout, constants=fast)
            out.append({"kernel": k, "tokens": T, "time_us": r.time_us, "dispatch_us": r.dispatch_us,
                        "combine_us": r.combine_us, **at})
            print("links bind", T, k, f"{r.time_us:.1f} us", flush=True)
    return out


def rerun_sensitivity(data: dict, kernels: tuple[str, ...] | None = None) -> dict:
    """``data`` with its one-knob changes and break-even sweep (ep-switch's; the sweep's
    reference is ep-switch-red) and its links-bind rungs run again on the settings it was
    made on, only those of ``kernels`` when given; the others kept."""
    out = dict(data)
    if kernels is None or "ep-switch" in kernels:
        out["sensitivity"] = sensitivity(data)
    fresh = links_bind(data, kernels)
    old = {(x["kernel"], x["tokens"]): x for x in data.get("links_bind", [])}
    new = {(x["kernel"], x["tokens"]): x for x in fresh}
    out["links_bind"] = [new.get(key, old.get(key)) for key in dict.fromkeys([*old, *new])]
    if kernels is None or {"ep-switch", "ep-switch-red"} & set(kernels):
        be, ref = break_even_runs(data)
        out["break_even"] = be if kernels is None or "ep-switch" in kernels else data["break_even"]
        out["break_even_ref"] = ref if kernels is None or "ep-switch-red" in kernels else data["break_even_ref"]
    return out


#: the ladder per mode from MoE layer runs (``cais run``): the systems, the rungs as layer
#: schemes (software first), and per mode the run shape (batch, seq; attention data
#: parallel, so each GPU routes its own tokens: batch in decode, batch x seq else; decode's
#: seq, the context, is the preset's 4,096)
MODE_SYSTEMS = ("dgx-h100", "gh200-nvl32")
MODE_RUNGS = ("ep-deepep", "ep-deepep-ll", "ep-switch-sw", "ep-switch-mcast", "ep-switch-red", "ep-switch-unfused",
              "ep-switch")
MODE_SOFTWARE = ("ep-deepep", "ep-deepep-ll")
MODE_SHAPES: dict[str, tuple[int, int | None]] = {"decode": (128, None), "prefill": (1, 512), "train": (1, 512)}
#: the event limit the per-mode runs are made under (unless CAIS_MAX_EVENTS says otherwise)
MODES_MAX_EVENTS = 100_000_000
MODE_MODEL = "deepseek-v3"
#: a layer-time ratio within this of 1 is called a tie in the per-mode verdict
TIE = 0.01


def layer_point(system_name: str, scheme: str, mode: str, sets: dict[str, str] | None = None) -> dict:
    """One MoE layer run (cais.experiments.layer.run_layer) of MODE_MODEL under ``scheme``
    (``sets``: config overrides): the layer's time and its dispatch and combine (forward
    and, in train, backward)."""
    from cais.config import apply_overrides
    from cais.experiments.layer import run_layer
    from cais.workload.moe import load_moe_model

    batch, seq = MODE_SHAPES[mode]
    shape = {"batch": batch, **({"seq": seq} if seq else {})}
    cfg = apply_overrides(load_system(system_name), sets) if sets else load_system(system_name)
    r = run_layer(cfg, load_moe_model(MODE_MODEL, **shape), scheme, mode, attention="dp")
    assert r.moe is not None
    return {"system": system_name, "mode": mode, "scheme": scheme, "tokens_per_rank": r.moe["tokens_per_rank"],
            "layer_us": r.total_us, "dispatch_us": r.moe["dispatch_us"], "combine_us": r.moe["combine_us"],
            "grouped_gemm_us": r.moe["grouped_gemm_us"], "fused_us": r.moe["fused_us"], "wall_s": r.wall_s}


def run_modes(modes: tuple[str, ...]) -> dict:
    out: dict = {"commit": commit(), "date": time.strftime("%Y-%m-%d"), "model": MODE_MODEL, "routing": "uniform",
                 "attention": "dp", "runs": []}
    for name in MODE_SYSTEMS:
        for mode in modes:
            for scheme in MODE_RUNGS:
                out["runs"].append(layer_point(name, scheme, mode))
                x = out["runs"][-1]
                print(name, mode, scheme, f"{x['layer_us']:.1f} us", f"{x['wall_s']:.1f} s", flush=True)
    return out


def modes_section(m: dict) -> list[str]:
    """The ladder per mode (module doc of MODE_RUNGS) from the stored layer runs."""
    runs = m["runs"]
    lines = ["**The ladder per mode** (MoE layer runs, `cais run --model deepseek-v3 --attention dp`, one layer "
             f"period, routing {m['routing']} with DeepSeek-V3's group limit, seed 0; stored in "
             f"`src/cais/data/ep_switch/modes.json`, commit {m['commit']}, {m['date']}). The fused members "
             "(ep-switch-sw, -mcast, -red and ep-switch) run each dispatch, the experts' GEMMs and activation "
             "and the combine as one kernel per block of tokens (in train the data-gradient chain alike, the "
             "weight gradients after it); ep-switch-unfused is ep-switch without the fusion, each phase on "
             "every SM in turn, so ep-switch-unfused over ep-switch is what fusion buys in that mode. Time in "
             "us; in brackets the speed-up over the best shipped software (DeepEP normal "
             "or low-latency, whichever is faster) on the same routing; layer = the whole period (attention "
             "included); expert block = dispatch, the experts' GEMMs and activation and combine (forward and "
             "backward in train; fused or one after the other).", "",
             "| system | mode | tokens per rank | time | " + " | ".join(MODE_RUNGS) + " |",
             "|---|---|---|---|" + "---|" * len(MODE_RUNGS)]
    verdict = []
    for name in dict.fromkeys(r["system"] for r in runs):
        for mode in dict.fromkeys(r["mode"] for r in runs if r["system"] == name):
            at = {r["scheme"]: r for r in runs if r["system"] == name and r["mode"] == mode}
            for label, val in (("layer", lambda r: r["layer_us"]), ("expert block", _block_us)):
                best = min(val(at[k]) for k in MODE_SOFTWARE if k in at)
                cells = [f"{val(at[k]):,.1f} ({best / val(at[k]):.2f}x)" if k in at else "-" for k in MODE_RUNGS]
                T = next(iter(at.values()))["tokens_per_rank"]
                lines.append(f"| {name} | {mode} | {T:,} | {label} | " + " | ".join(cells) + " |")
            if "ep-switch" in at:
                best_k = min(MODE_SOFTWARE, key=lambda k: at[k]["layer_us"] if k in at else float("inf"))
                sw = at["ep-switch"]["layer_us"]
                g = at[best_k]["layer_us"] / sw
                word = "wins" if g >= 1 + TIE else "loses" if g <= 1 - TIE else f"ties (within {TIE:.0%})"
                parts = [f"{lab} {at[k]['layer_us'] / sw:.2f}x" for lab, k in
                         (("the switch's multicast and reduction", "ep-switch-sw"), ("fusion", "ep-switch-unfused"))
                         if k in at]
                verdict.append(f"- {name} {mode}: ep-switch {word}: {g:.2f}x the layer over {best_k} ("
                               + "; ".join(parts) + ").")
    return lines + ["", "Where the in-switch scheme wins, from these runs only (on the layer's time; a tie: "
                    f"within {TIE:.0%}):", ""] + verdict + [""]


def _block_us(r: dict) -> float:
    """A stored layer run's expert block: dispatch, grouped GEMMs and combine, or its
    fused blocks (which hold all three; the activation is in either only when fused)."""
    return r["dispatch_us"] + r["grouped_gemm_us"] + r["combine_us"] + r.get("fused_us", 0.0)


def _gain(rows: list[dict], r: dict) -> str:
    base = [x for x in rows if x["kernel"] == "deepep" and x["world"] == r["world"] and x["tokens"] == r["tokens"]
            and x["routing"] == r["routing"]]
    return f"{base[0]['time_us'] / r['time_us']:.2f}x" if base else "-"


#: each part's gain: (label, the rung without it, the rung with it)
PARTS = (("the software counterpart over DeepEP normal", "deepep", "ep-switch-sw"),
         ("the multicast (ep-switch-sw -> ep-switch-mcast)", "ep-switch-sw", "ep-switch-mcast"),
         ("the reduction (ep-switch-sw -> ep-switch-red)", "ep-switch-sw", "ep-switch-red"),
         ("fusion (ep-switch-unfused -> ep-switch)", "ep-switch-unfused", "ep-switch"),
         ("ep-switch over DeepEP normal", "deepep", "ep-switch"))
SOFTWARE = ("deepep", "deepep-ll", "ep-switch-sw")


def _parts(rows: list[dict]) -> list[str]:
    """Per world, each part's gain (the time without it over the time with it) over the
    token counts and routings run, and ep-switch over the best software at each point."""
    out = []
    for w in dict.fromkeys(r["world"] for r in rows):
        sub = [r for r in rows if r["world"] == w]
        points = list(dict.fromkeys((r["tokens"], r["routing"]) for r in sub))
        at = {(r["tokens"], r["routing"], r["kernel"]): r["time_us"] for r in sub}
        bits = []
        for label, without, with_ in PARTS:
            g = [at[(T, x, without)] / at[(T, x, with_)] for T, x in points
                 if (T, x, without) in at and (T, x, with_) in at]
            if g:
                bits.append(f"{label} {min(g):.2f}x to {max(g):.2f}x")
        best = []
        for T, x in points:
            soft = [(at[(T, x, k)], k) for k in SOFTWARE if (T, x, k) in at]
            if soft and (T, x, "ep-switch") in at:
                t, k = min(soft)
                best.append(f"{T:,} {x}: {t / at[(T, x, 'ep-switch')]:.2f}x over {k}")
        out += [f"{w}, over the token counts and routings run: " + "; ".join(bits) + ".", "",
                "ep-switch over the best software at each point (below 1: it loses): " + "; ".join(best) + ".", ""]
    return out


def section(data: dict, modes: dict | None = None) -> str:
    rows = data["rungs"]
    runs = [*rows, *data.get("sensitivity", []), *data.get("links_bind", []), *data["break_even"],
            data["break_even_ref"]]
    ran = dict.fromkeys(f"{r.get('commit', data['commit'])}, {r.get('date', data['date'])}" for r in runs)
    made = data.get("made_on")
    on = (" Made with a VC per traffic class at the switch inputs (8 VCs) and the EP constants of then "
          "(sm_copy_GBps 14.5, ll_fixed_us 11.6), before the NVSwitch presets queued per destination "
          "(docs/fabric-model.md); the stored runs rerun alike with those settings (`made_on` in the file; a "
          "partial rerun of the script keeps them), and `scripts/ep_switch_ladder.py --run` remakes them on the "
          "current ones." if made else "")
    lines = [f"Generated by `scripts/ep_switch_ladder.py` from the runs stored in "
             f"`src/cais/data/ep_switch/ladder.json` (commit {'; '.join(ran)}).{on} "
             "DeepSeek-V3's MoE shape: hidden 7,168, top-8 of the experts, expert FFN 2,048, FP8 dispatch and "
             "GEMMs, BF16 combine; one layer's dispatch, expert GEMM and combine; time in us, gain = DeepEP "
             "normal's time over the rung's on the same routing (seed 0; power-law alpha 1.2, log-normal "
             "sigma 1).", ""]
    worlds = list(dict.fromkeys(r["world"] for r in rows))
    for w in worlds:
        sub = [r for r in rows if r["world"] == w]
        kernels = list(dict.fromkeys(r["kernel"] for r in sub))
        lines += [f"**{w}**", "", "| tokens per rank | routing | " + " | ".join(kernels) + " |",
                  "|---|---|" + "---|" * len(kernels)]
        for T in dict.fromkeys(r["tokens"] for r in sub):
            for rout in dict.fromkeys(r["routing"] for r in sub):
                cells = []
                for k in kernels:
                    got = [r for r in sub if r["tokens"] == T and r["routing"] == rout and r["kernel"] == k]
                    cells.append(f"{got[0]['time_us']:,.1f} ({_gain(rows, got[0])})" if got else "-")
                lines.append(f"| {T:,} | {rout} | " + " | ".join(cells) + " |")
        lines.append("")
        tab = [r for r in sub if r["kernel"] == "ep-switch"]
        if tab:
            lines.append("Group-table peak entries per port (ep-switch): " + ", ".join(
                f"{r['tokens']:,} {r['routing']} {r['group_peak']}" for r in tab) + f"; overflows: "
                f"{sum(r['overflows'] for r in tab)}. Merge-unit peak lines of 320: "
                f"{max(r['merge_peak_lines'] for r in tab)}.")
            lines.append("")
    lines += _parts(rows)
    if modes is not None:
        lines += modes_section(modes)
    lines += ["**The group table's need** (busiest port, 99th percentile over seeds; entry bytes as hw/ep_switch.py "
              f"sizes them; against CAIS's {CAIS_TABLE_BYTES:,} B):", "",
              "| ranks | tokens per rank | routing | lifetime | entries (p99) | bytes (p99) | of 40 KB | seeds |",
              "|---|---|---|---|---|---|---|---|"]
    for n in data["need"]:
        lines.append(f"| {n['ranks']} | {n['tokens']:,} | {n['routing']} | {n['lifetime']} | {n['entries_p99']:,} | "
                     f"{n['bytes_p99']:,} | {n['of_cais_40KB']:.3f} | {n['seeds']} |")
    c = lookup_cost()
    cfg = load_system("dgx-h100")
    port = max(cfg.switch.links_per_gpu) * cfg.link.bandwidth_GBps
    need_rate = packets_per_ns(port, cfg.packet.max_payload_bytes)
    lines += ["", f"**Its cost** (the 40 KB table as the merge unit's Content Array, CACTI's stored run scaled to "
              f"{c['node_nm']} nm, {c['clock_GHz']} GHz): {c['area_mm2']:.4f} mm^2 and {c['leakage_mW']:.2f} mW "
              f"per port, {c['lookup_pJ']:.2f} pJ per lookup (one 128 B line read), {c['latency_ns']:.2f} ns "
              f"per lookup, {c['lookups_per_ns']:.2f} lookups per ns per port. A dgx-h100 port ({port:.0f} GB/s "
              f"on one chip) asks at most {need_rate:.2f} per ns (one per 128 B packet): margin "
              f"{c['lookups_per_ns'] / need_rate:.2f}x.", ""]
    sens = data.get("sensitivity", [])
    if sens:
        w, T, rout = SENSITIVITY_POINT
        lines += [f"**One knob at a time** (ep-switch, {w}, {T:,} tokens, {rout}; merged and evicted: the merge "
                  "units' reduction sessions, all chips):", "",
                  "| change | time (us) | group-table peak | overflows | merged | evicted |", "|---|---|---|---|---|---|"]
        for x in sens:
            lines.append(f"| {x['label']} | {x['time_us']:,.1f} | {x['group_peak']} | {x['overflows']} | "
                         f"{x['merged']:,} | {x['evicted']:,} |")
        lines.append("")
    lb = data.get("links_bind", [])
    if lb:
        ks = list(dict.fromkeys(x["kernel"] for x in lb))
        lines += [f"**Where the links bind** (dgx-h100, {SENSITIVITY_POINT[2]}, the SM copy loop at "
                  f"{UNBOUNDED_GBPS:g} GB/s instead of the fitted rate; time in us, gain over DeepEP normal at the "
                  "same rate):", "", "| tokens per rank | " + " | ".join(ks) + " |", "|---|" + "---|" * len(ks)]
        for T in dict.fromkeys(x["tokens"] for x in lb):
            at = {x["kernel"]: x["time_us"] for x in lb if x["tokens"] == T}
            lines.append(f"| {T:,} | " + " | ".join(f"{at[k]:,.1f} ({at['deepep'] / at[k]:.2f}x)" for k in ks)
                         + " |")
        lines.append("")
    be, ref = data["break_even"], data["break_even_ref"]
    lines += [f"**Break-even lookup latency** (dgx-h100, {BREAK_EVEN_POINT[1]:,} tokens, "
              f"{BREAK_EVEN_POINT[2]}): ep-switch with a lookup of " + ", ".join(
                  f"{b['lookup_ns']:g} ns: {b['time_us']:,.1f} us" for b in be)
              + f"; without multicast ({ref['kernel']}): {ref['time_us']:,.1f} us. " + _break_even(be, ref["time_us"]),
              ""]
    return "\n".join(lines)


def _break_even(be: list[dict], ref: float) -> str:
    for a, b in zip(be, be[1:]):
        if a["time_us"] <= ref < b["time_us"]:
            x = a["lookup_ns"] + (ref - a["time_us"]) * (b["lookup_ns"] - a["lookup_ns"]) / (b["time_us"] - a["time_us"])
            return f"The multicast stops paying at a lookup of about {x:,.0f} ns (linear between the runs)."
    if be and be[0]["time_us"] > ref:
        return "The multicast does not pay even at no lookup latency here."
    return f"The multicast still pays at {be[-1]['lookup_ns']:g} ns (the largest tried)."


def write_doc(text: str) -> None:
    page = DOC.read_text()
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="store_true", help="simulate the grid and store the runs")
    ap.add_argument("--quick", action="store_true", help="with --run: the dgx-h100 grid only")
    ap.add_argument("--world", choices=[w[0] for w in GRID],
                    help="rerun this world's rungs only and keep the other stored runs")
    ap.add_argument("--kernels", nargs="+", choices=LADDER,
                    help="rerun only these rungs (in --world's world, else in every world; with --sensitivity, "
                         "only their one-knob, links-bind and break-even runs) and keep the other stored runs")
    ap.add_argument("--modes", nargs="*", choices=tuple(MODE_SHAPES),
                    help="run the ladder's layer schemes per mode (default: all) and store them")
    ap.add_argument("--sensitivity", action="store_true",
                    help="rerun the one-knob changes, the links-bind rungs and the break-even sweep and store them")
    ap.add_argument("--write-doc", action="store_true", help="write the section into docs/moe.md")
    args = ap.parse_args()
    if args.run:
        STORE.parent.mkdir(parents=True, exist_ok=True)
        STORE.write_text(json.dumps(run(args.quick), indent=1) + "\n")
    data = json.loads(STORE.read_text())
    kernels = tuple(args.kernels) if args.kernels else None
    if args.world or kernels is not None and not args.run:
        data = rerun_world(data, args.world, kernels)
        STORE.write_text(json.dumps(data, indent=1) + "\n")
    if args.run or args.sensitivity:
        data = rerun_sensitivity(data, None if args.run else kernels)
        STORE.write_text(json.dumps(data, indent=1) + "\n")
    if args.modes is not None:
        # DeepSeek-V3's train layer under ep-deepep-ll on gh200-nvl32 is estimated at 5.9e7 events, past the
        # layer path's default limit (cais.limits): these runs are made on purpose, so the limit is raised
        os.environ.setdefault("CAIS_MAX_EVENTS", str(MODES_MAX_EVENTS))
        MODES_STORE.write_text(json.dumps(run_modes(tuple(args.modes or MODE_SHAPES)), indent=1) + "\n")
    text = section(data, json.loads(MODES_STORE.read_text()) if MODES_STORE.exists() else None)
    if args.write_doc:
        write_doc(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
