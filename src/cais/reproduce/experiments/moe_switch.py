"""Past the paper, part 2 of ``cais reproduce moe``: the in-switch EP ladder (docs/moe.md,
"In-switch expert parallelism", a proposal in DySHARP's spirit, arXiv 2605.05607) in
whole MoE layers, each rung a layer scheme run as ``cais run --attention dp`` runs it
(:func:`cais.reproduce.points.layer_point`, the same :class:`~cais.experiments.spec.LayerSpec`
path): the best shipped software (``ep-deepep``; ``ep-deepep-ll`` up to
:data:`LL_MAX_TOKENS` tokens per rank, its buffers being sized for decode batches), the
same dataflow in software on an NVLS switch (``ep-switch-sw``), multicast only
(``ep-switch-mcast``), reduction only (``ep-switch-red``), both without token-centric
fusion (``ep-switch-unfused``) and both fused (``ep-switch``).

Grid (:data:`FULL`): worlds ``dgx-h100`` (EP 8), ``gh200-nvl32`` (EP 32) and ``nvl72`` at
EP 64: no EP degree above 64 and up to 72 divides either model's experts (256 and 128;
DeepEP's tests' trick of ``(256 // 72) * 72`` experts is not the model), and an nvl72
layer at EP 64 simulates in under two minutes a rung in decode at 128 tokens per rank
(measured on the shared 2-core machine the grid was sized on; :data:`LEFT_OUT`), so 64
is the largest EP degree in reach. Models ``deepseek-v3`` and ``qwen3-30b-a3b`` (nvl72:
deepseek-v3 only, :data:`WORLD_MODELS`); routings ``uniform`` and ``powerlaw``
(``moe.routing``, alpha 1.2); modes and tokens per rank per world as :data:`FULL` says,
sized from measured walls (:data:`LEFT_OUT` names what is not run and why). Attention
data parallel, so each GPU routes its own tokens: in decode ``batch`` = the tokens (the
context is the preset's 4,096), else one sequence of that many tokens.

Per point: the in-switch scheme's layer time over the best software's, its expert
block (dispatch, the experts' grouped GEMMs and activation, combine: fused in one kernel
for the fused members, schemes/ep.py) over theirs, that gain split into the software
dataflow (``ep-switch-sw`` over the best software), the multicast (``ep-switch-mcast``
over ``ep-switch-sw``), the reduction (``ep-switch-red`` over ``ep-switch-sw``) and the
rest (what the two together give beyond the product of each alone), what fusion buys
(``ep-switch-unfused`` over ``ep-switch``, on the layer and on the block), the group
table's peak entries per port (the run's telemetry) and the table a call needs at the
routing's 99th percentile (:func:`cais.experiments.ep_table.table_need`, its own
points). The kernel-level ladder's fusion figures and break-even lookup latency are
cited from its stored runs (``src/cais/data/ep_switch/ladder.json``);
the break-even lookup rate is each world's port packet rate against the table's
(:mod:`cais.cost.group_table`). Claims: per world and mode, whether the in-switch scheme
beats the best software on the layer's time; per world on its expert block; that the
multicast gains more than the reduction; that the same dataflow in software beats the
shipped software; that fusion speeds the layer up."""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Any

import pandas as pd

from cais.config import load_system
from cais.cost.group_table import CAIS_TABLE_BYTES, lookup_cost, packets_per_ns
from cais.reproduce import plots
from cais.reproduce.experiments.common import LAYER, Context
from cais.reproduce.experiments.cost import break_even
from cais.reproduce.report import Section
from cais.sweep.grid import Point

TABLE = "cais.reproduce.points:ep_table_point"
#: the rungs as layer schemes, software first; the shipped software among them
RUNGS = ("ep-deepep", "ep-deepep-ll", "ep-switch-sw", "ep-switch-mcast", "ep-switch-red", "ep-switch-unfused",
         "ep-switch")
SOFTWARE = ("ep-deepep", "ep-deepep-ll")
MODELS = ("deepseek-v3", "qwen3-30b-a3b")
ROUTINGS = ("uniform", "powerlaw")
#: the most tokens per rank ep-deepep-ll runs (DeepEP sizes its buffers for decode batches; as moe.py)
LL_MAX_TOKENS = 1024
#: full grid per world (system, EP degree): the modes and their tokens per rank
FULL: dict[tuple[str, int], dict[str, tuple[int, ...]]] = {
    ("dgx-h100", 8): {"decode": (128, 1024), "prefill": (128, 1024), "train": (128, 1024)},
    ("gh200-nvl32", 32): {"decode": (128,), "prefill": (512,), "train": (128,)},
    ("nvl72", 64): {"decode": (128,)},
}
#: the worlds that run fewer models than :data:`MODELS` (for run time: :data:`LEFT_OUT`)
WORLD_MODELS: dict[tuple[str, int], tuple[str, ...]] = {("nvl72", 64): ("deepseek-v3",)}
#: what the full grid leaves out, and the measured reason (walls on the 2-core machine the grid was sized on)
LEFT_OUT = ("gh200-nvl32 beyond one size per mode (a rung took 1.5-16 s in decode at 128 tokens per rank, 6-62 s in "
            "prefill at 512, 9-46 s in train at 128, and 25-103 s in train at 512 in the stored per-mode runs); "
            "nvl72 for qwen3-30b-a3b (its 12 decode runs at 128 tokens took 588 s, 31-67 s each) and beyond decode "
            "at 128 tokens per rank (a deepseek-v3 rung there took 35-117 s; prefill at the same tokens routes the "
            "same rows and train runs every exchange twice, so neither is cheaper): walls measured on the shared "
            "2-core machine this grid ran on (load 3.5-4), where the grid as it is took about 30 minutes on two "
            "workers; nvl72 at EP 72: no EP degree from 65 to 72 divides either model's experts (256, 128)")
#: the quick grid: the context's system, one model, decode and prefill at a decode size
QUICK = {"decode": (128,), "prefill": (128,)}
QUICK_MODEL = "qwen3-30b-a3b"
#: a ratio within this of 1 is a tie in the verdict
TIE = 0.01
#: routing seeds the table need is taken over (per EP degree; the p99 of these)
NEED_SEEDS = {8: 20, 32: 10, 64: 10}


def _shape(mode: str, tokens: int) -> dict[str, int]:
    """The run shape of ``tokens`` per rank under data-parallel attention (module doc)."""
    return {"batch": tokens} if mode == "decode" else {"batch": 1, "seq": tokens}


def _grid(ctx: Context) -> list[tuple[str, int, str, str, int]]:
    """(system, EP degree, model, mode, tokens per rank) of every case."""
    if ctx.quick:
        ep = load_system(ctx.system).gpus
        return [(ctx.system, ep, QUICK_MODEL, mode, t) for mode, toks in QUICK.items() for t in toks]
    worlds = {((ctx.system, 8) if (s, ep) == ("dgx-h100", 8) else (s, ep)): modes for (s, ep), modes in FULL.items()}
    return [(s, ep, m, mode, t) for (s, ep), modes in worlds.items() for m in WORLD_MODELS.get((s, ep), MODELS)
            for mode, toks in modes.items() for t in toks]


def expected(tokens: int) -> tuple[str, ...]:
    """The rungs a point runs at ``tokens`` per rank (ep-deepep-ll up to :data:`LL_MAX_TOKENS`)."""
    return tuple(s for s in RUNGS if s != "ep-deepep-ll" or tokens <= LL_MAX_TOKENS)


def ladder_points(ctx: Context) -> list[tuple[str, Point]]:
    """Every rung's layer run at every case of :func:`_grid` and routing, and the group
    table's need per (EP degree, model, routing, tokens)."""
    out: list[tuple[str, Point]] = []
    needs: dict[tuple[int, str, str, int], None] = {}
    for system, ep, model, mode, t in _grid(ctx):
        for rout in ROUTINGS:
            base = {**ctx.base(system, **{"moe.routing": rout}), "gpus": ep, "model": model, "mode": mode,
                    "attention": "dp", **_shape(mode, t)}
            out += [(LAYER, {**base, "scheme": s}) for s in expected(t)]
            needs[(ep, model, rout, t)] = None
    out += [(TABLE, {"ranks": ep, "model": model, "routing": rout, "tokens": t, "seeds": NEED_SEEDS.get(ep, 10)})
            for ep, model, rout, t in needs]
    return out


KEYS = ["system", "ep", "model", "mode", "routing", "tokens"]


def ladder_table(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """One row per (system, EP, model, mode, routing, tokens per rank) from the layer
    rows (ok_rows of :func:`ladder_points`'s layer points): each rung's layer time and
    expert block time (us: dispatch, grouped GEMMs and combine, or the fused blocks), the
    best software, the gains and the split (module doc), fusion's gain, the group
    table's peak entries per port and overflows (ep-switch);
    and the points left out because a rung of theirs has no row, in words."""
    # a row stored before runs reported fused blocks had none (only the in-switch family fuses)
    fused = rows["fused_us"].fillna(0.0) if "fused_us" in rows else 0.0
    df = rows.assign(ep=rows["ep_run"].astype(int), routing=rows["moe_routing"],
                     tokens=rows["tokens_per_rank"].astype(int),
                     dc=rows["dispatch_us"] + rows["grouped_gemm_us"] + rows["combine_us"] + fused)
    out, missing = [], []
    for key, part in df.groupby(KEYS, sort=False):
        at = {r["scheme"]: r for _, r in part.iterrows()}
        lack = [s for s in expected(int(key[-1])) if s not in at]
        if lack:
            missing.append(" ".join(map(str, key)) + f" (no {', '.join(lack)})")
            continue
        soft = [s for s in SOFTWARE if s in at]
        best = min(soft, key=lambda s: at[s]["total_us"])  # the best software on the layer's time
        best_dc = min(soft, key=lambda s: at[s]["dc"])  # and on the expert block
        row: dict[str, Any] = dict(zip(KEYS, key))
        row.update({f"{s} (us)": at[s]["total_us"] if s in at else float("nan") for s in RUNGS})
        row.update({f"{s} block (us)": at[s]["dc"] if s in at else float("nan") for s in RUNGS})
        sw, sw_dc = at["ep-switch-sw"], at["ep-switch-sw"]["dc"]
        mc = sw_dc / at["ep-switch-mcast"]["dc"] if "ep-switch-mcast" in at else float("nan")
        red = sw_dc / at["ep-switch-red"]["dc"] if "ep-switch-red" in at else float("nan")
        whole = sw_dc / at["ep-switch"]["dc"]
        unf = at["ep-switch-unfused"]
        row.update({"best software": best, "best block": best_dc,
                    "in-switch / best (layer)": at[best]["total_us"] / at["ep-switch"]["total_us"],
                    "in-switch / best (block)": at[best_dc]["dc"] / at["ep-switch"]["dc"],
                    "sw dataflow / best (block)": at[best_dc]["dc"] / sw_dc, "multicast (block)": mc,
                    "reduction (block)": red, "rest (block)": whole / (mc * red),
                    "fusion (layer)": unf["total_us"] / at["ep-switch"]["total_us"],
                    "fusion (block)": unf["dc"] / at["ep-switch"]["dc"],
                    "sw dataflow / best (layer)": at[best]["total_us"] / sw["total_us"],
                    "experts": int(at["ep-switch"]["experts_run"]),
                    "busiest rank load": at["ep-switch"]["busiest_rank_load"],
                    "group peak": int(at["ep-switch"]["group_table_peak"]),
                    "group overflows": int(at["ep-switch"]["group_table_overflows"])})
        out.append(row)
    return pd.DataFrame(out), missing


def _word(ratio: float) -> str:
    return "wins" if ratio > 1 + TIE else "loses" if ratio < 1 - TIE else "ties"


def _count(ratios: pd.Series) -> str:
    words = ratios.map(_word).value_counts()
    return ", ".join(f"{w} {int(words[w])}" for w in ("wins", "ties", "loses") if w in words)


def _claim(sec: Section, name: str, ratios: pd.Series, where: str) -> str:
    """Record claim ``name``: the ratio wins (above 1 + TIE) at every point; its verdict line."""
    if not len(ratios):
        return ""
    figure = f"{_count(ratios)} of {len(ratios)} points {where} ({ratios.min():.2f}x to {ratios.max():.2f}x)"
    return f"{name}: {sec.claim(name, bool((ratios > 1 + TIE).all()), figure)}: {figure}."


def _tally(ratios: pd.Series) -> str:
    """wins/ties/losses of ``ratios`` (a tie: within TIE of 1)."""
    words = ratios.map(_word)
    return "/".join(str(int((words == w).sum())) for w in ("wins", "ties", "loses"))


def _world_line(system: str, ep: int, part: pd.DataFrame) -> str:
    """Where the in-switch scheme wins on one world: per mode on the layer's time, and
    on its expert block over all its points."""
    modes = ", ".join(f"{mode} {_tally(m['in-switch / best (layer)'])}" for mode, m in part.groupby("mode", sort=False))
    gpus = load_system(system).gpus
    experts = sorted({int(e) for e in part["experts"]}, reverse=True)
    larger = [k for k in range(ep + 1, gpus + 1) if all(e % k == 0 for e in experts)]
    why = f" of {gpus} GPUs, the most that divides {' and '.join(map(str, experts))} experts" if ep < gpus and not larger \
        else ""
    return (f"On {system} (EP {ep}{why}), ep-switch's layer against the best software (wins/ties/losses): {modes}; "
            f"its expert block: {_tally(part['in-switch / best (block)'])}; fusion on the layer: "
            f"{_tally(part['fusion (layer)'])}.")


def _stored_ladder() -> dict[str, Any]:
    """The kernel-level ladder's stored runs (scripts/ep_switch_ladder.py)."""
    return json.loads((resources.files("cais") / "data" / "ep_switch" / "ladder.json").read_text())


def fusion_and_lookup(data: dict[str, Any]) -> tuple[str, str]:
    """From the stored kernel-level ladder: (fusion's gain, ep-switch-unfused's time over
    ep-switch's, per world over its points, in words; the break-even lookup latency of
    its sweep, in words, :func:`cais.reproduce.experiments.cost.break_even` over
    ep-switch-red's time over ep-switch's at each lookup)."""
    rungs = data["rungs"]
    at = {(r["world"], r["tokens"], r["routing"], r["kernel"]): r["time_us"] for r in rungs}
    fusion = []
    for w in dict.fromkeys(r["world"] for r in rungs):
        g = [at[(w, T, x, "ep-switch-unfused")] / t for (w2, T, x, k), t in at.items()
             if w2 == w and k == "ep-switch" and (w, T, x, "ep-switch-unfused") in at]
        if g:
            fusion.append(f"{w} {min(g):.2f}x to {max(g):.2f}x over {len(g)} points")
    commits = ", ".join(dict.fromkeys(str(r.get("commit", data["commit"])) for r in rungs))
    be, ref = data["break_even"], data["break_even_ref"]["time_us"]
    x, words = break_even([b["lookup_ns"] for b in be], [ref / b["time_us"] for b in be])
    if x == x and not math.isinf(x):
        swept = ", ".join(f"{b['lookup_ns']:g}" for b in be)
        words = f"about {x:,.0f} ns (linear between the swept {swept} ns)"
    return (("; ".join(fusion) or "not in the stored runs") + f" (commit {commits})"), words


def lookup_rates(systems: list[str]) -> list[str]:
    """Per world: the lookups per ns one port may ask (one per full packet at its links'
    rate on one chip) against the 40 KB table's rate (cais.cost.group_table)."""
    c = lookup_cost()
    out = []
    for name in systems:
        cfg = load_system(name)
        need = packets_per_ns(max(cfg.switch.links_per_gpu) * cfg.link.bandwidth_GBps, cfg.packet.max_payload_bytes)
        out.append(f"{name} {need:.2f} per ns (margin {c['lookups_per_ns'] / need:.2f}x)")
    return out


def ladder_section(ctx: Context, sec: Section, layer: pd.DataFrame, need: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Add the ladder's part to ``sec`` (prose, table, a plot per world) and return its
    table (written as ``moe_switch.csv``) and its verdict lines (claims recorded on ``sec``)."""
    t, missing = ladder_table(layer)
    if missing:
        sec.p("The in-switch ladder leaves out, for a rung with no run: " + "; ".join(missing) + ".")
    if not len(t):
        sec.p("The in-switch ladder: no point has a run of every rung.")
        return t, []
    if len(need):
        n = need.rename(columns={"ranks": "ep", "entries_p99": "need entries (p99)", "bytes_p99": "need bytes (p99)"})
        t = t.merge(n[["ep", "model", "routing", "tokens", "need entries (p99)", "need bytes (p99)"]],
                    on=["ep", "model", "routing", "tokens"], how="left")
        t["need / 40 KB"] = t["need bytes (p99)"] / CAIS_TABLE_BYTES
        t = t.astype({"need entries (p99)": "Int64", "need bytes (p99)": "Int64"})
    lines = []
    for (system, ep), part in t.groupby(["system", "ep"], sort=False):
        for mode, m in part.groupby("mode", sort=False):
            lines.append(_claim(sec, f"the in-switch scheme beats the best software in {mode} on {system}",
                                m["in-switch / best (layer)"], "on the layer"))
        lines.append(_claim(sec, f"its expert block beats the best software's on {system}",
                            part["in-switch / best (block)"], "on the block"))
    mc, red = t["multicast (block)"], t["reduction (block)"]
    name = "the multicast gains more than the reduction"
    fig = f"multicast {mc.min():.2f}x to {mc.max():.2f}x, reduction {red.min():.2f}x to {red.max():.2f}x on the block"
    lines.append(f"{name}: {sec.claim(name, bool((mc > red).all()), fig)}: {fig}.")
    lines.append(_claim(sec, "the software dataflow (ep-switch-sw) beats the shipped software",
                        t["sw dataflow / best (block)"], "on the block"))
    lines.append(_claim(sec, "token-centric fusion speeds the layer up", t["fusion (layer)"],
                        "on the layer"))
    lines += [_world_line(s, int(ep), p) for (s, ep), p in t.groupby(["system", "ep"], sort=False)]
    fusion, lookup = fusion_and_lookup(_stored_ladder())
    c = lookup_cost()
    systems = list(dict.fromkeys(t["system"]))
    peak = t["group peak"]
    sec.p("**The in-switch ladder in MoE layers** (a proposal: docs/moe.md, \"In-switch expert parallelism\"). Each "
          "rung is a layer scheme run as `cais run --attention dp` runs it, one layer period, on the same routing "
          "(`moe.routing`; power-law alpha 1.2; seed 0): ep-deepep and ep-deepep-ll (the faster of the two is 'best "
          "software' on the layer's time, 'best block' on the expert block; ep-deepep-ll up to "
          f"{LL_MAX_TOKENS:,} tokens per rank), ep-switch-sw (the same dataflow in software on an NVLS switch), "
          "ep-switch-mcast (multicast dispatch only), ep-switch-red (reduction combine only), ep-switch-unfused "
          "(both, without fusion), ep-switch (both, fused). 'in-switch / best' is the best software's time over "
          "ep-switch's (above 1: ep-switch is faster), on the whole layer and on its expert block (dispatch, the "
          "experts' GEMMs and activation, combine; forward and backward in train; one kernel per block of tokens "
          "for the fused members). The block's gain is split into the software dataflow (sw dataflow / best "
          "block), the multicast (ep-switch-sw over ep-switch-mcast), the reduction (ep-switch-sw over "
          "ep-switch-red) and the rest (what both together give beyond the product of each alone); their product "
          "is the block's gain. 'fusion' is ep-switch-unfused's time over ep-switch's. In the "
          f"verdict a ratio within {TIE:.0%} of 1 is a tie; a claim that ep-switch beats the best software holds "
          "where it wins at every point.")
    sec.p("Fusion at the kernel level (one layer's dispatch, GEMM and combine alone), from the stored ladder "
          f"(src/cais/data/ep_switch/ladder.json): {fusion}. "
          + ("" if ctx.quick else f"Not run: {LEFT_OUT}."))
    sec.p(f"**The group table.** Peak entries per port in these runs (ep-switch's telemetry): {int(peak.min())} to "
          f"{int(peak.max())}, {int(t['group overflows'].sum())} overflows. 'need' is the table a whole call needs "
          "at the routing's 99th percentile over seeds (the busiest sender port's distinct destination sets of two "
          f"ranks or more, cais.experiments.ep_table), against CAIS's {CAIS_TABLE_BYTES:,} B"
          + (f": at most {t['need bytes (p99)'].max():,.0f} B ({t['need / 40 KB'].max():.2f} of it)."
             if "need bytes (p99)" in t else ".")
          + f" Its lookup at 12 nm, 1.5 GHz (cais.cost.group_table): {c['latency_ns']:.2f} ns, "
          f"{c['lookups_per_ns']:.2f} lookups per ns per port; the most a port asks (one per 128 B packet): "
          + ", ".join(lookup_rates(systems)) + ". The break-even lookup latency, from the stored kernel-level "
          f"sweep (dgx-h100, 1,024 tokens, uniform; ep-switch against ep-switch-red): {lookup}.")
    shown = ["system", "ep", "model", "mode", "routing", "tokens", "best software", "best block", "ep-switch (us)",
             "in-switch / best (layer)", "in-switch / best (block)", "sw dataflow / best (block)", "multicast (block)",
             "reduction (block)", "fusion (layer)", "group peak", "need entries (p99)"]
    sec.table(t[[c for c in shown if c in t]])
    for (system, ep), part in t.groupby(["system", "ep"], sort=False):
        groups = [f"{'ds' if m.startswith('deepseek') else 'qw'} {mo[:3]} {r[:3]} {tok}" for m, mo, r, tok in
                  zip(part["model"], part["mode"], part["routing"], part["tokens"])]
        series = {"in-switch / best (layer)": list(part["in-switch / best (layer)"]),
                  "in-switch / best (block)": list(part["in-switch / best (block)"]),
                  "sw dataflow / best (block)": list(part["sw dataflow / best (block)"]),
                  "multicast (block)": list(part["multicast (block)"]),
                  "reduction (block)": list(part["reduction (block)"]), "fusion (layer)": list(part["fusion (layer)"])}
        name = f"moe_switch_{system}.png"
        plots.bars(ctx.out / name, groups, series, "speed-up (x)", f"In-switch EP ladder on {system}, EP {ep}",
                   ratio=True)
        sec.img(name)
    return t, [ln for ln in lines if ln]


def table_need_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The table-need points' rows (ok_rows), one per (EP, model, routing, tokens)."""
    keep = ["ranks", "model", "routing", "tokens", "entries_p99", "bytes_p99", "of_cais_40KB", "seeds"]
    return rows[[c for c in keep if c in rows]].drop_duplicates(["ranks", "model", "routing", "tokens"]) \
        if "entries_p99" in rows else pd.DataFrame(columns=keep)
