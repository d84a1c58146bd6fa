"""Past the paper (issues 57, 64): what each part of CAIS buys and what the merge unit costs.

- **The ladder**: tp-nvls, cais-base, cais-sw, cais-wo-coord, cais-partial, cais, one
  layer period each, and the switch's share of CAIS's gain (CAIS over ``cais-sw``,
  :mod:`cais.reproduce.switch_share`), on the context's system and on paper-world.
- **The merge unit's cost** (:mod:`cais.cost.merge_unit`): its arrays from CACTI (22 nm,
  scaled by bit cell to the paper's 12 nm and to 7 and 5 nm), its adders (Horowitz) and
  a clocked pipeline, per design (:data:`cais.cost.merge_unit.DESIGNS`: the device type,
  the content array's ports, BF16 or FP32 accumulation, per-link tables, the clock's
  range), beside the paper's 0.50 mm^2 and the hand-written bit-cell model.
- **The latency sweep, with its noise**: CAIS with ``switch.merge.latency_ns`` swept
  over 0-200 ns, each point also run with the world's link latency moved by
  :data:`PERTURB_NS` (a physical perturbation far below any effect it could have: the
  simulator has no seed), so that a change inside the runs' spread is called none.
- **The rate's break-even**: CAIS with ``switch.merge.lookups_per_ns`` swept down from no
  limit (reductions taking their two access slots): where its speedup over TP-NVLS and
  over ``cais-sw`` falls to 1.0, against each design's rate at its clock.
- **CAIS at each design's own latency and rate** (``switch.merge.cacti_node`` with the
  design's settings).
- **Energy per layer period**: the merge units' line lookups x a lookup's energy (the
  most: a reduction's), their leakage over the period, and the NVLink bits x the
  link's pJ/bit at both ends of its range (:data:`LINK_PJ_PER_BIT`), for CAIS, cais-sw
  and TP-NVLS: links and merge units only.

Then one claim per line (:meth:`Section.claim`, the same names on every grid).
Missing data is an error with one line (:class:`cais.errors.UserError`), never a zero
or a verdict."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

import pandas as pd

from cais.config import apply_overrides, load_system
from cais.cost import merge_unit as MU
from cais.errors import UserError
from cais.reproduce import paper as P
from cais.reproduce import plots
from cais.reproduce.area import merge_unit_mm2
from cais.reproduce.experiments.common import (LAYER, Context, Experiment, compare, failures, ok_rows, one_model,
                                               worlds)
from cais.reproduce.report import Section
from cais.reproduce.switch_share import switch_share
from cais.sweep.grid import Point

#: the ladder's rungs, from TP-NVLS to CAIS (docs/cais.md, "What each part buys")
LADDER = ("tp-nvls", "cais-base", "cais-sw", "cais-wo-coord", "cais-partial", "cais")
#: added merge latency (ns) and access-slot rates (per port per ns) CAIS is run at
LATENCIES_NS = (25.0, 50.0, 100.0, 150.0, 200.0)
RATES = (3.0, 2.0, 1.5, 1.0, 0.7, 0.5, 0.3, 0.2, 0.1)
RATES_QUICK = (3.0, 1.5, 1.0, 0.5, 0.3, 0.1)
#: the noise runs: the world's link.latency_ns moved by these (ns) at every swept latency
PERTURB_NS = (-1.0, -0.5, 0.5, 1.0)
#: the link's energy per bit (pJ), low and high ends and a middle value, each with its source
LINK_PJ_PER_BIT = {
    1.3: "NVLink-C2C, a die-to-die link in one package (NVIDIA Grace Hopper whitepaper; Hot Chips 34, 2022): "
         "the low end",
    # the SerDes figure analyses of NVLink-C2C set beside its 1.3 pJ/bit (e.g. besthub.dev, "Why Nvidia's NVLink
    # C2C is redefining GPU-CPU interconnects": 1.3 against 5.5 pJ/bit for a 112 Gb/s PAM4 SerDes)
    5.5: "a 112 Gb/s PAM4 SerDes, the figure analyses of NVLink-C2C set beside its 1.3 (not an NVIDIA figure "
         "for NVLink 4): the middle",
    14.0: "NVSwitch 1's chip power per bit switched, 100 W over 18 x 50 GB/s (Hot Chips 30, 2018), charged per "
          "link bit: the high end",
}
LINK_LOW, LINK_HIGH = min(LINK_PJ_PER_BIT), max(LINK_PJ_PER_BIT)
#: the merge units' share of CAIS's link and merge energy called small: the project's own choice
SMALL_SHARE = 0.10
#: switch chips and merge units of the systems run here (4 chips x 8 GPU ports)
SWITCH_CHIPS = 4
#: the claims, one name each, the same on every grid
CLAIM_AREA = "the merge unit fits the paper's area"
CLAIM_RATE = "the unit's rate clears CAIS's break-even"
CLAIM_OWN = "CAIS beats TP-NVLS at the unit's own latency and rate"
CLAIM_LATENCY = "CAIS beats TP-NVLS with up to 200 ns of merge latency"
CLAIM_ENERGY = "the merge units are a small share of CAIS's energy"


def _worlds(ctx: Context) -> list[Any]:
    """The context's system as it is and paper-world (Fig. 11's worlds i and iii)."""
    return [w for w in worlds(ctx) if w.key in ("as-sold", "paper-world")]


def _modes(ctx: Context) -> tuple[str, ...]:
    return ctx.modes or (("prefill",) if ctx.quick else P.MODES)


def _design_sets(d: MU.Design) -> dict[str, Any]:
    """The ``switch.merge`` settings that run design ``d`` (at the verdict's node)."""
    base = MU.Design()
    sets: dict[str, Any] = {"switch.merge.cacti_node": f"{d.node_nm}nm"}
    for k, v in asdict(d).items():
        if k != "node_nm" and v != getattr(base, k):
            sets[f"switch.merge.{k}"] = v
    return sets


def _link_latency(ctx: Context, w: Any) -> float:
    """The world's link.latency_ns (the noise runs move it)."""
    return float(apply_overrides(load_system(w.system), {**ctx.sets, **dict(w.sets)}).link.latency_ns)


def cost_points(ctx: Context) -> list[tuple[str, Point]]:
    """Per world and mode: the ladder; CAIS at each added latency (and its noise runs),
    each access-slot rate (reductions at two slots) and each design."""
    m = one_model(ctx)
    rates = RATES_QUICK if ctx.quick else RATES
    out = []
    for w in _worlds(ctx):
        ws = dict(w.sets)
        link = _link_latency(ctx, w)

        def pt(scheme: str, mode: str, **sets: Any) -> tuple[str, Point]:
            return LAYER, {**ctx.base(w.system, **ws, **sets), **m, "scheme": scheme, "mode": mode,
                           "sms": P.SMS_HALF}

        for mode in _modes(ctx):
            out += [pt(s, mode) for s in LADDER]
            for x in (0.0, *LATENCIES_NS):
                lat = {"switch.merge.latency_ns": x} if x else {}
                if x:
                    out.append(pt("cais", mode, **lat))
                out += [pt("cais", mode, **lat, **{"link.latency_ns": link + dp}) for dp in PERTURB_NS]
            out += [pt("cais", mode, **{"switch.merge.lookups_per_ns": r, "switch.merge.red_accesses": 2})
                    for r in rates]
            out += [pt("cais", mode, **_design_sets(d)) for d in MU.DESIGNS]
    return out


def break_even(xs: list[float], speedups: list[float], log: bool = False) -> tuple[float, str]:
    """Where ``speedups`` (at ``xs``, ordered from the unit's own setting, no added
    latency or no rate limit, to the worst) first falls to 1.0: (the x interpolated
    between the two points around it, in log x where ``log``, and in words). ``xs[0]``
    may be infinite (no limit): a fall between it and the first finite x is reported
    as "above" that x. NaN ("stays above 1") where it never falls; -inf where it is at
    or below 1 at ``xs[0]``. Fewer than two points: a :class:`UserError` (no verdict
    without a sweep)."""
    unit = "slots/ns" if log else "ns"
    if len(speedups) < 2 or len(xs) != len(speedups):
        raise UserError(f"cost: a break-even needs a sweep of at least two points, got {len(speedups)}; "
                        "rerun `cais reproduce cost` so that its sweep points run")
    if speedups[0] <= 1.0:
        return -math.inf, "already <= 1 without it"
    for (x0, s0), (x1, s1) in zip(zip(xs, speedups), zip(xs[1:], speedups[1:])):
        if s1 > 1.0:
            continue
        if math.isinf(x0):
            return x1, f"above {x1:g} {unit}"
        f = (s0 - 1.0) / (s0 - s1) if s0 != s1 else 0.0
        x = math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0))) if log else x0 + f * (x1 - x0)
        return x, f"{x:.3g} {unit}"
    return float("nan"), f"stays above 1 (to {xs[-1]:g} {unit})"


def noise_free_up_to(xs: list[float], times: list[float], noise: float) -> float:
    """The largest ``xs[i]`` up to which every point's time (the median of its runs)
    is within ``noise`` of the time at ``xs[0]`` (no added latency): "no measurable
    effect up to" it. ``xs[0]`` itself where the first swept point is already beyond."""
    best = xs[0]
    for x, t in zip(xs[1:], times[1:]):
        if abs(t - times[0]) > noise:
            break
        best = x
    return best


def _lookups(r: Any, where: str) -> int:
    """A CAIS run's line lookups; a run without them is a one-line error."""
    v = r.get("merge_lookups") if hasattr(r, "get") else None
    if v is None or v != v or int(v) <= 0:
        raise UserError(f"cost: the CAIS run of {where} has no merge-lookup count (a run made before issue 57, "
                        "kept in runs/): delete that folder's runs/ and run `cais reproduce cost` again")
    return int(v)


def _sets(row: Any) -> dict[str, Any]:
    return json.loads(row["sets"])


def cost_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """The ladder, the cost tables, the sweeps with their noise and break-even points,
    each design's run, the energy per period and the claims."""
    df = ok_rows(rows)
    sec = Section("cost", "Past the paper: what each part buys, and what the merge unit costs")
    bad = failures(rows)
    if bad:
        sec.p("Failed points: " + "; ".join(bad[:5]) + (" ..." if len(bad) > 5 else ""))
    run, source = MU.cost(fresh=True)
    ports = run["gpus"]
    table = MU.table(run)
    designs = MU.designs(run)
    evals = {d: MU.evaluate(run, d) for d in MU.DESIGNS}
    base_d = MU.DESIGNS[0]
    base_e = evals[base_d]
    lstp_e = evals[next(d for d in MU.DESIGNS if d.cells == "itrs-lstp")]

    ladder_rows, lat_rows, rate_rows, be_rows, design_rows, energy_rows = [], [], [], [], [], []
    for w in _worlds(ctx):
        base = w.base(ctx)
        base_sets = json.loads(base["sets"])
        wd = df[df["system"] == base["system"]]
        link = _link_latency(ctx, w)
        for mode in _modes(ctx):
            d = wd[wd["mode"] == mode]
            plain = d[d["sets"] == base["sets"]]
            t = {r["scheme"]: r for _, r in plain.iterrows()}
            if "tp-nvls" not in t or "cais" not in t:
                continue
            where = f"{w.label} {mode}"
            tp = t["tp-nvls"]["total_us"]
            sw = t["cais-sw"]["total_us"] if "cais-sw" in t else float("nan")
            for s in LADDER:
                if s in t:
                    ladder_rows.append({"world": w.label, "mode": mode, "rung": s, "total_us": t[s]["total_us"],
                                        "over TP-NVLS": tp / t[s]["total_us"]})
            share = switch_share(plain.assign(model=plain["model"]))
            if len(share):
                ladder_rows.append({"world": w.label, "mode": mode, "rung": "switch share (cais over cais-sw)",
                                    "total_us": float("nan"), "over TP-NVLS": float(share["switch share"].iloc[0])})
            cais = [(r, {k: v for k, v in _sets(r).items() if base_sets.get(k) != v})
                    for _, r in d[d["scheme"] == "cais"].iterrows()]

            # ---- the latency sweep and its noise ------------------------------------------------
            by_lat: dict[float, list[float]] = {0.0: [t["cais"]["total_us"]]}
            for r, extra in cais:
                keys = set(extra) - {"link.latency_ns"}
                if keys <= {"switch.merge.latency_ns"} and (keys or "link.latency_ns" in extra):
                    if "link.latency_ns" in extra and abs(float(extra["link.latency_ns"]) - link) > 2:
                        continue
                    by_lat.setdefault(float(extra.get("switch.merge.latency_ns", 0.0)), []).append(r["total_us"])
            xs = sorted(by_lat)
            if len(xs) < 2:
                raise UserError(f"cost: the latency sweep of {where} has {len(xs)} point(s); it needs at least two "
                                "(rerun `cais reproduce cost` so that its sweep points run)")
            lo = [min(by_lat[x]) for x in xs]
            hi = [max(by_lat[x]) for x in xs]
            mid = [sorted(by_lat[x])[len(by_lat[x]) // 2] for x in xs]
            # the noise: the median over the swept latencies of the spread of one latency's runs
            spreads = sorted(b - a for a, b in zip(lo, hi))
            noise = spreads[len(spreads) // 2]
            quiet = noise_free_up_to(xs, mid, noise)
            for x, a, b, c in zip(xs, lo, hi, mid):
                lat_rows.append({"world": w.label, "mode": mode, "latency_ns": x, "runs": len(by_lat[x]),
                                 "least_us": a, "median_us": c, "most_us": b, "spread": (b - a) / c,
                                 "change": (c - mid[0]) / mid[0], "inside the noise": abs(c - mid[0]) <= noise,
                                 "over TP-NVLS (least)": tp / b, "over TP-NVLS (most)": tp / a,
                                 "over cais-sw (least)": sw / b})
            be_lat = break_even(xs, [tp / b for b in hi])
            be_rows.append({"world": w.label, "mode": mode, "knob": "switch.merge.latency_ns", "over": "TP-NVLS",
                            "break_even": be_lat[0], "break-even": be_lat[1],
                            "noise": noise / mid[0], f"change at {xs[-1]:g} ns": (mid[-1] - mid[0]) / mid[0],
                            "no measurable effect up to (ns)": quiet})

            # ---- the rate sweep -----------------------------------------------------------------
            pts = [(math.inf, t["cais"]["total_us"])]
            for r, extra in cais:
                if set(extra) == {"switch.merge.lookups_per_ns", "switch.merge.red_accesses"}:
                    pts.append((float(extra["switch.merge.lookups_per_ns"]), r["total_us"]))
            pts.sort(key=lambda p: p[0], reverse=True)
            rx = [p[0] for p in pts]
            for x, tt in pts:
                rate_rows.append({"world": w.label, "mode": mode, "lookups_per_ns": x, "total_us": tt,
                                  "over TP-NVLS": tp / tt, "over cais-sw": sw / tt})
            be_tp = break_even(rx, [tp / tt for _, tt in pts], log=True)
            be_sw = break_even(rx, [sw / tt for _, tt in pts], log=True)
            row = {"world": w.label, "mode": mode, "break-even over TP-NVLS": be_tp[0],
                   "over cais-sw": be_sw[0], "in words": be_tp[1]}
            for dd in MU.DESIGNS:
                if dd.accumulate == "bf16" and dd.data_ports == "1rw":
                    row[f"{dd.label} (slots/ns)"] = evals[dd]["lookups_per_ns"]
            row["margin at the stated clock"] = (base_e["lookups_per_ns"] / be_tp[0]
                                                 if be_tp[0] == be_tp[0] and not math.isinf(be_tp[0]) else math.inf)
            be_rows.append({"world": w.label, "mode": mode, "knob": "switch.merge.lookups_per_ns", "over": "TP-NVLS",
                            "break_even": be_tp[0], "break-even": be_tp[1]})
            be_rows.append({"world": w.label, "mode": mode, "knob": "switch.merge.lookups_per_ns", "over": "cais-sw",
                            "break_even": be_sw[0], "break-even": be_sw[1]})

            # ---- each design's own latency and rate -------------------------------------------
            for dd in MU.DESIGNS:
                want = {k: str(v) for k, v in _design_sets(dd).items()}
                hit = [r for r, extra in cais if {k: str(v) for k, v in extra.items()} == want]
                if hit:
                    tt = hit[0]["total_us"]
                    design_rows.append({"world": w.label, "mode": mode, "design": dd.label,
                                        "latency_ns": evals[dd]["latency_ns"],
                                        "lookups_per_ns": evals[dd]["lookups_per_ns"],
                                        "red_accesses": dd.red_accesses, "total_us": tt, "over TP-NVLS": tp / tt,
                                        "over cais-sw": sw / tt})
            row["base design's run over TP-NVLS"] = next(
                (x["over TP-NVLS"] for x in design_rows[::-1] if x["world"] == w.label and x["mode"] == mode
                 and x["design"] == base_d.label), float("nan"))
            be_rows[-2].update({k: v for k, v in row.items() if k not in ("world", "mode", "in words")})

            # ---- energy per layer period -----------------------------------------------------
            for s in ("cais", "cais-sw", "tp-nvls"):
                if s not in t:
                    continue
                r = t[s]
                bits = (r["wire_up_GB"] + r["wire_down_GB"]) * r["gpus_run"] * 8e9
                lookups = _lookups(r, where) if s == "cais" else 0
                units = SWITCH_CHIPS * ports if s == "cais" else 0
                dyn = lookups * base_e["pJ_max"] / 1e6
                leak_hp = units * base_e["leakage_mW"] * 1e-3 * r["total_us"]  # mW x us = nJ; /1e3: uJ
                leak_lstp = units * lstp_e["leakage_mW"] * 1e-3 * r["total_us"]
                e = {"world": w.label, "mode": mode, "scheme": s, "period_us": r["total_us"], "link_Gbit": bits / 1e9,
                     "merge_lookups": lookups, "merge_dynamic_uJ": dyn, "leakage_uJ (HP)": leak_hp,
                     "leakage_uJ (LSTP)": leak_lstp}
                for pj in (LINK_LOW, LINK_HIGH):
                    link_uJ = bits * pj / 1e6
                    tot = link_uJ + dyn + leak_hp
                    e[f"total_uJ @{pj:g}"] = tot
                    e[f"merge share @{pj:g}"] = (dyn + leak_hp) / tot
                e[f"merge share @{LINK_LOW:g}, LSTP"] = (dyn + leak_lstp) / (bits * LINK_LOW / 1e6 + dyn + leak_lstp)
                energy_rows.append(e)
    ladder, lat, rate, be, dsg, energy = (pd.DataFrame(x) for x in (ladder_rows, lat_rows, rate_rows, be_rows,
                                                                    design_rows, energy_rows))
    if not len(lat) or not len(rate):
        raise UserError("cost: no world has both TP-NVLS's and CAIS's runs; rerun `cais reproduce cost`")

    # ---- figures --------------------------------------------------------------------------------
    series = {}
    for (w, m), g in lat.groupby(["world", "mode"], sort=False):
        series[f"{w} {m} (least)"] = (list(g["latency_ns"]), list(g["over TP-NVLS (least)"]))
        series[f"{w} {m} (most)"] = (list(g["latency_ns"]), list(g["over TP-NVLS (most)"]))
    plots.lines(ctx.out / "cost_latency.png", series, "merge latency added (ns)", "CAIS over TP-NVLS (x)",
                f"CAIS's speedup against the merge unit's added latency (least and most of {len(PERTURB_NS) + 1} runs)",
                hline=1.0)
    series = {f"{w} {m} over {o}": ([min(v, 100.0) for v in g["lookups_per_ns"]], list(g[f"over {o}"]))
              for (w, m), g in rate.groupby(["world", "mode"], sort=False) for o in ("TP-NVLS", "cais-sw")}
    plots.lines(ctx.out / "cost_rate.png", series, "access slots per port per ns (log; 100 = no limit)",
                "CAIS speedup (x)", "CAIS's speedup against the merge unit's rate", hline=1.0, logx=True,
                vlines={f"HP, one port, {dd.clock_GHz:g} GHz": evals[dd]["lookups_per_ns"] for dd in MU.DESIGNS[:3]})

    # ---- the claims -----------------------------------------------------------------------------
    a_arr = ports * base_e["arrays_mm2"]
    a_add = ports * base_e["adders_mm2"]
    area = a_arr + a_add
    lines: list[str] = []
    ok = sec.claim(CLAIM_AREA, area <= P.AREA_SWITCH_MM2,
                   f"{area:.2f} mm^2 per chip at 12 nm ({a_arr:.2f} arrays + {a_add:.2f} adders)")
    lines.append(f"{CLAIM_AREA}: {ok}; ours {area:.2f} mm^2 per chip at 12 nm ({a_arr:.2f} arrays + {a_add:.2f} BF16 "
                 f"adders), paper {P.AREA_SWITCH_MM2:.2f}; every world")
    rb = be[(be["knob"] == "switch.merge.lookups_per_ns") & (be["over"] == "TP-NVLS")]
    fin = [x for x in rb["break_even"] if x == x and not math.isinf(x)]
    lost = any(x == -math.inf for x in rb["break_even"])
    worst = max(fin) if fin else 0.0
    wrow = rb.loc[rb["break_even"].idxmax()] if fin else None
    mine = base_e["lookups_per_ns"]
    ok = sec.claim(CLAIM_RATE, not lost and mine >= worst,
                   f"{mine:g} slots/ns at {base_d.clock_GHz:g} GHz against a break-even of {worst:.2f}")
    at = f"{wrow['world']} {wrow['mode']}" if wrow is not None else "every world"
    clk = {dd.clock_GHz: evals[dd]["lookups_per_ns"] for dd in MU.DESIGNS[:3]}
    lstp_rate = lstp_e["lookups_per_ns"]
    lines.append(f"{CLAIM_RATE}: {ok}; ours {mine:g} slots/ns per port at {base_d.clock_GHz:g} GHz ("
                 + ", ".join(f"{v:g} at {k:g} GHz" for k, v in sorted(clk.items()) if k != base_d.clock_GHz)
                 + f"; LSTP cells {lstp_rate:g}), break-even {worst:.2f} ({at}), margin {mine / worst:.2f}x; "
                 "paper: none" if worst else f"{CLAIM_RATE}: {ok}; no break-even found")
    own = dsg[dsg["design"] == base_d.label]
    if not len(own):
        raise UserError("cost: no run of CAIS at the unit's own latency and rate; rerun `cais reproduce cost`")
    least = own.loc[own["over TP-NVLS"].idxmin()]
    ok = sec.claim(CLAIM_OWN, bool((own["over TP-NVLS"] > 1).all()),
                   f"least {least['over TP-NVLS']:.2f}x ({least['world']} {least['mode']})")
    ends = []
    for dd in MU.DESIGNS[1:3]:
        g = dsg[dsg["design"] == dd.label]
        if len(g):
            ends.append(f"{g['over TP-NVLS'].min():.2f}x at {dd.clock_GHz:g} GHz")
    lines.append(f"{CLAIM_OWN}: {ok}; ours {least['over TP-NVLS']:.2f}x at least ({least['world']} {least['mode']}; "
                 f"{base_e['latency_ns']:.1f} ns, {mine:g} slots/ns; " + ", ".join(ends)
                 + f"), paper {P.fig11_paper('tp-nvls', 'prefill'):g}x/{P.fig11_paper('tp-nvls', 'train'):g}x "
                 "(Fig. 11)")
    sw_own = own["over cais-sw"]
    free = rate[rate["lookups_per_ns"] == math.inf]["over cais-sw"]

    def span(v: pd.Series) -> str:
        return f"{v.min():.2f}x" if f"{v.min():.2f}" == f"{v.max():.2f}" else f"{v.min():.2f}-{v.max():.2f}x"

    lines.append(f"CAIS over cais-sw (the switch's own gain) at the unit's own latency and rate: {span(sw_own)} "
                 f"(with no cost: {span(free)})")
    worst_lat = lat.loc[lat["over TP-NVLS (least)"].idxmin()]
    ok = sec.claim(CLAIM_LATENCY, bool((lat["over TP-NVLS (least)"] > 1).all()),
                   f"least {worst_lat['over TP-NVLS (least)']:.2f}x")
    lb = be[be["knob"] == "switch.merge.latency_ns"]
    lines.append(f"{CLAIM_LATENCY}: {ok}; ours {worst_lat['over TP-NVLS (least)']:.2f}x at least "
                 f"({worst_lat['world']} {worst_lat['mode']}, {worst_lat['latency_ns']:g} ns); paper: none")
    top = f"change at {LATENCIES_NS[-1]:g} ns"
    for _, r in lb.iterrows():
        q = r["no measurable effect up to (ns)"]
        lines.append(f"merge latency, {r['world']} {r['mode']}: "
                     + (f"no measurable effect up to {q:g} ns" if q > 0 else
                        f"measurable from {LATENCIES_NS[0]:g} ns")
                     + f"; at {LATENCIES_NS[-1]:g} ns {100 * r[top]:+.2f} % (noise {100 * r['noise']:.2f} %)")
    c = energy[energy["scheme"] == "cais"]
    hi_share = float(c[f"merge share @{LINK_LOW:g}"].max())
    lo_share = float(c[f"merge share @{LINK_HIGH:g}"].min())
    ok = sec.claim(CLAIM_ENERGY, hi_share < SMALL_SHARE,
                   f"{100 * lo_share:.1f}-{100 * hi_share:.1f} % (links at {LINK_HIGH:g}-{LINK_LOW:g} pJ/bit)")
    lines.append(f"{CLAIM_ENERGY} (< {100 * SMALL_SHARE:.0f} %, our own threshold): {ok}; ours {100 * lo_share:.1f} % "
                 f"({LINK_HIGH:g} pJ/bit) to {100 * hi_share:.1f} % ({LINK_LOW:g} pJ/bit), HP cells; paper: none")
    rel = []
    for pj in (LINK_LOW, LINK_HIGH):
        m = c.merge(energy[energy["scheme"] == "tp-nvls"], on=["world", "mode"], suffixes=("", "_o"))
        r_ = m[f"total_uJ @{pj:g}"] / m[f"total_uJ @{pj:g}_o"]
        rel.append(f"{r_.min():.2f}-{r_.max():.2f}x at {pj:g} pJ/bit")
    lines.append("CAIS's link and merge energy against TP-NVLS's (links and merge units only: not HBM, not NVLS's "
                 "ALUs, not the SMs): " + ", ".join(rel))
    sec.says(*lines)

    # ---- the report -----------------------------------------------------------------------------
    sec.p(f"Model {one_model(ctx)['model']}, {P.SMS_HALF} SMs, one layer period per point; worlds: "
          + ", ".join(w.label for w in _worlds(ctx)) + f". Merge-unit figures: {source}.")
    sec.p("The ladder (one period, us, and the speedup over TP-NVLS; the last row is the switch's share of "
          "CAIS's gain over TP-NVLS, log(cais-sw/cais) / log(tp-nvls/cais)):")
    sec.table(ladder)
    hand = merge_unit_mm2(P.TABLE_KB_SIMULATED, "16/12 nm")
    sec.table(pd.DataFrame([
        compare("merge units per switch chip, 12 nm, arrays and adders (mm^2)", area, P.AREA_SWITCH_MM2,
                "ours: CACTI's arrays (periphery included) scaled by bit cell, and Horowitz's adders; the paper's "
                "synthesis also has match logic, control and pipeline registers, and its own cells"),
        compare("the same, arrays only (mm^2)", a_arr, P.AREA_SWITCH_MM2,
                "arrays alone: the adders, match logic and control are the rest of the paper's figure"),
        compare("the same, the hand-written bit-cell model (mm^2)", hand, P.AREA_SWITCH_MM2,
                "bit cells over one array efficiency, no periphery, no adders (cais.reproduce.area)")]), summary=True)
    sec.p(f"The arrays of one port (the chip has {ports} GPU ports): CAM tags of {run['tag_bits']} bits (a "
          f"{run['address_bits']}-bit address, the project's choice, less the 128 B line offset, plus the request "
          f"type), the content array's {run['entries']} x {run['line_bytes']} B lines, and {run['meta_bits']} bits "
          f"of merging-table state per entry (state, count, {ports - 1} waiting requesters' port and "
          f"{MU.TXN_TAG_BITS}-bit transaction tag). CACTI runs 22 nm; the other nodes scale its area by the "
          "ratio of published bit cells, its energies and leakage by that ratio's square root; times stay CACTI's "
          "22 nm (conservative at a FinFET node). Bit cells:")
    sec.table(pd.DataFrame([{"node_nm": n, "bit cell (um^2)": a, "source": s} for n, (a, s) in MU.CELL_UM2.items()]))
    sec.table(table.round(5))
    sec.p(f"The designs (per chip: {ports} ports; per port: latency, rate, energy). Adders: {run['line_bytes'] // 2} "
          f"lanes per table, {MU.ADDER_SOURCE}: BF16 as {MU.ADDERS['bf16'][2]} ({MU.ADDERS['bf16'][0]} pJ, "
          f"{MU.ADDERS['bf16'][1]:g} um^2), FP32 as {MU.ADDERS['fp32'][2]} ({MU.ADDERS['fp32'][0]} pJ, "
          f"{MU.ADDERS['fp32'][1]:g} um^2), scaled by bit cell from 45 nm (area) and by its square root and "
          f"({MU.V_FINFET} V / {MU.V_45NM} V)^2 (energy). The pipeline, the project's choice: tag match, state, "
          f"data read (each the whole cycles CACTI's access takes), {MU.ADD_CYCLES['bf16']} (BF16) or "
          f"{MU.ADD_CYCLES['fp32']} (FP32) add cycles and {MU.CONTROL_CYCLES} control cycle, at a clock of "
          f"{MU.CLOCK_GHZ:g} GHz (an assumption; {min(MU.CLOCK_RANGE_GHZ):g}-{max(MU.CLOCK_RANGE_GHZ):g} GHz "
          "shown). A port starts clock x tables / (the slowest array's cycles per access) access slots per ns; a "
          "reduction's line takes two on a one-port data array (its read and its write), one on a 1R1W array. "
          "A lookup's energy: at least a search and the state's read and write (pJ_min), at most a reduction's "
          "(with the line's read and write and the adders: pJ_max, what the energy below charges).")
    sec.table(designs)
    sec.p("The rate's break-even (access slots per port per ns, reductions at two) against each clock's rate, per "
          "world; the margin is the stated clock's rate over the break-even:")
    sec.table(be[(be["knob"] == "switch.merge.lookups_per_ns") & (be["over"] == "TP-NVLS")].drop(
        columns=["knob", "over", "break_even", "break-even"]).dropna(axis=1, how="all"))
    sec.img("cost_rate.png")
    sec.table(rate)
    sec.p(f"CAIS at each design's own latency and rate (switch.merge.cacti_node=12nm with the design's settings):")
    sec.table(dsg)
    sec.p(f"The latency sweep with its noise: each latency run {len(PERTURB_NS) + 1} times, the world's "
          f"link.latency_ns moved by {', '.join(f'{x:+g}' for x in PERTURB_NS)} ns (the simulator has no seed; "
          "a link latency changed by under 0.5 % shifts a period by far less than the spread it shows). The "
          "noise is the median, over the swept latencies, of one latency's spread of times; a latency whose "
          "median time is within it of the time at 0 ns has no measurable effect. No line is fitted through "
          "the points and nothing is extrapolated beyond them.")
    sec.table(lb.drop(columns=["knob"]).dropna(axis=1, how="all"))
    sec.img("cost_latency.png")
    sec.table(lat)
    sec.p(f"Energy per layer period (uJ): the NVLink bits (both directions of every GPU's links) x the link's "
          f"pJ/bit at both ends: " + "; ".join(f"{k:g} pJ/bit, {v}" for k, v in LINK_PJ_PER_BIT.items())
          + f". The merge units: their line lookups x {base_e['pJ_max']:.1f} pJ (a reduction's, the most a lookup "
          f"costs) and their leakage ({SWITCH_CHIPS} chips x {ports} ports) over the period, HP cells "
          f"({ports * base_e['leakage_mW']:.1f} mW per chip; LSTP {ports * lstp_e['leakage_mW']:.2f} mW, at half "
          "the rate), at 12 nm. Links and merge units only: not HBM, not NVLS's ALUs, not the SMs.")
    sec.table(energy)
    out = pd.concat([ladder.assign(part="ladder"), table.assign(part="cost"), designs.assign(part="designs"),
                     be.assign(part="break-even"), lat.assign(part="latency"), rate.assign(part="rate"),
                     dsg.assign(part="design runs"), energy.assign(part="energy")], ignore_index=True)
    return out, sec


EXPERIMENT = Experiment("cost", "cost", cost_points, cost_analyse)
