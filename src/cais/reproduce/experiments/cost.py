"""Past the paper (issue 57): what each part of CAIS buys and what the merge unit costs.

- **The ladder**: tp-nvls, cais-base, cais-sw, cais-wo-coord, cais-partial, cais, one
  layer period each, and the switch's share of CAIS's gain (CAIS over ``cais-sw``,
  :mod:`cais.reproduce.switch_share`), on the context's system and on paper-world.
- **The merge unit's cost** from CACTI (:mod:`cais.cost.merge_unit`): area, energy per
  access, leakage, access and cycle time per array, per port and per switch chip at
  22 nm (CACTI) and scaled to the paper's 12 nm and to 7 nm, beside the paper's
  0.50 mm^2 and the hand-written bit-cell model (:mod:`cais.reproduce.area`).
- **Break-even**: CAIS with ``switch.merge.latency_ns`` swept over 0-200 ns and with
  ``switch.merge.lookups_per_ns`` swept down from no limit: where its speedup over
  TP-NVLS and over ``cais-sw`` falls to 1.0; and CAIS with CACTI's own latency and
  rate (``switch.merge.cacti_node``).
- **Energy per layer period**: the merge units' line lookups x CACTI's pJ per access,
  their leakage over the period, and the NVLink bytes x :data:`NVLINK_PJ_PER_BIT`,
  for CAIS, cais-sw and TP-NVLS.

Then a verdict on the paper's premise (§I, §III) that the extensions fit "without
unacceptable area, power, or per-packet latency overhead"."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from cais.cost import merge_unit as MU
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
#: added merge latency (ns) and lookup rates (per port per ns) CAIS is run at
LATENCIES_NS = (25.0, 50.0, 100.0, 150.0, 200.0)
LATENCIES_NS_QUICK = LATENCIES_NS
RATES = (3.0, 1.0, 0.7, 0.5, 0.3, 0.2, 0.1, 0.03)
RATES_QUICK = (3.0, 1.0, 0.5, 0.3, 0.1)
#: the node whose CACTI figures feed the simulation and the energy (the nearest the report
#: covers to NVSwitch 3's TSMC 4N)
NODE = "7nm"
#: NVLink energy per bit: NVLink-C2C's 1.3 pJ/bit (NVIDIA, Grace Hopper, Hot Chips 34, 2022;
#: the Grace Hopper Superchip architecture whitepaper). A die-to-die link in one package: the
#: board-level NVLink 4 SerDes to an NVSwitch costs more per bit, so this is a lower bound on
#: the link energy and an upper bound on the merge unit's share of the total.
NVLINK_PJ_PER_BIT = 1.3
NVLINK_SOURCE = "NVLink-C2C, 1.3 pJ/bit (NVIDIA, Hot Chips 34, 2022): a lower bound for board-level NVLink 4"
#: switch chips and merge units of the systems run here (4 chips x 8 GPU ports)
SWITCH_CHIPS = 4


def _worlds(ctx: Context) -> list[Any]:
    """The context's system as it is and paper-world (Fig. 11's worlds i and iii)."""
    return [w for w in worlds(ctx) if w.key in ("as-sold", "paper-world")]


def _modes(ctx: Context) -> tuple[str, ...]:
    return ctx.modes or (("prefill",) if ctx.quick else P.MODES)


def cost_points(ctx: Context) -> list[tuple[str, Point]]:
    """Per world and mode: the ladder; CAIS at each added latency, each lookup rate and
    CACTI's own (:data:`NODE`)."""
    m = one_model(ctx)
    lats = LATENCIES_NS_QUICK if ctx.quick else LATENCIES_NS
    rates = RATES_QUICK if ctx.quick else RATES
    out = []
    for w in _worlds(ctx):
        ws = dict(w.sets)

        def pt(scheme: str, mode: str, **sets: Any) -> tuple[str, Point]:
            return LAYER, {**ctx.base(w.system, **ws, **sets), **m, "scheme": scheme, "mode": mode,
                           "sms": P.SMS_HALF}

        for mode in _modes(ctx):
            out += [pt(s, mode) for s in LADDER]
            out += [pt("cais", mode, **{"switch.merge.latency_ns": x}) for x in lats]
            out += [pt("cais", mode, **{"switch.merge.lookups_per_ns": r}) for r in rates]
            out.append(pt("cais", mode, **{"switch.merge.cacti_node": NODE}))
    return out


def _knob(sets: str, key: str) -> float | str | None:
    v = json.loads(sets).get(key)
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        return str(v)


def break_even(xs: list[float], speedups: list[float], log: bool = False) -> tuple[float, str]:
    """Where ``speedups`` (at ``xs``, ordered from the unit's own setting, no added
    latency or no rate limit, to the worst) first falls to 1.0: (the x interpolated
    between the two points around it, in log x where ``log``, and in words). ``xs[0]``
    may be infinite (no limit): a fall between it and the first finite x is reported
    as "above" that x. NaN ("stays above 1") where it never falls; -inf where it is at
    or below 1 at ``xs[0]``."""
    unit = "lookups/ns" if log else "ns"
    if not speedups:
        return float("nan"), "no run"
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


def extrapolate(xs: list[float], times: list[float], target: float) -> float:
    """The added latency at which the least-squares line through (``xs``, ``times``)
    reaches ``target`` (the other scheme's time): a break-even beyond the swept range,
    NaN where the time does not grow with the latency or is already past it."""
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(times) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, times)) / sxx if sxx else 0.0
    if slope <= 0 or target <= times[0]:
        return float("nan")
    return (target - (my - slope * mx)) / slope


def cost_analyse(ctx: Context, rows: pd.DataFrame) -> tuple[pd.DataFrame, Section]:
    """The ladder, the cost table, the sweeps with their break-even points, the energy
    per period and the verdict."""
    df = ok_rows(rows)
    sec = Section("cost", "Past the paper: what each part buys, and what the merge unit costs")
    bad = failures(rows)
    if bad:
        sec.p("Failed points: " + "; ".join(bad[:5]) + (" ..." if len(bad) > 5 else ""))
    run, source = MU.cost(fresh=True)
    ports = run["gpus"]
    table = MU.table(run)
    nm = int(NODE.removesuffix("nm"))
    tim = MU.timing(run, nm)
    chip = table[table["array"].str.startswith("chip")].set_index("node_nm")
    port = table[table["array"] == "port"].set_index("node_nm")

    # ---- the ladder and the sweeps, per world and mode ------------------------------------
    ladder_rows, sweep_rows, energy_rows, be_rows = [], [], [], []
    for w in _worlds(ctx):
        base = w.base(ctx)
        wd = df[df["system"] == base["system"]]
        ws = dict(w.sets)
        for mode in _modes(ctx):
            d = wd[wd["mode"] == mode]
            plain = d[d["sets"] == base["sets"]]
            t = {r["scheme"]: r for _, r in plain.iterrows()}
            if "tp-nvls" not in t or "cais" not in t:
                continue
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
            cais = d[d["scheme"] == "cais"]
            for key, unit, log in (("switch.merge.latency_ns", "ns", False), ("switch.merge.lookups_per_ns",
                                                                                 "lookups/ns", True)):
                pts = [(0.0 if not log else math.inf, t["cais"]["total_us"])]
                for _, r in cais.iterrows():
                    v = _knob(r["sets"], key)
                    extra = set(json.loads(r["sets"])) - set(json.loads(base["sets"]))
                    if isinstance(v, float) and extra == {key}:
                        pts.append((v, r["total_us"]))
                pts.sort(key=lambda p: p[0], reverse=log)
                xs = [p[0] for p in pts]
                for x, tt in pts:
                    sweep_rows.append({"world": w.label, "mode": mode, "knob": key, "value": x, "total_us": tt,
                                       "over TP-NVLS": tp / tt, "over cais-sw": sw / tt})
                for what, b in (("TP-NVLS", tp), ("cais-sw", sw)):
                    be, words = break_even(xs, [b / tt for _, tt in pts], log)
                    row = {"world": w.label, "mode": mode, "knob": key, "over": what, "break_even": be,
                           "break-even": words}
                    if not log:
                        row["extrapolated_ns"] = extrapolate(xs, [tt for _, tt in pts], b)
                    be_rows.append(row)
            cac = [r for _, r in cais.iterrows() if _knob(r["sets"], "switch.merge.cacti_node") == NODE]
            if cac:
                tt = cac[0]["total_us"]
                sweep_rows.append({"world": w.label, "mode": mode, "knob": f"switch.merge.cacti_node={NODE}",
                                   "value": float("nan"), "total_us": tt, "over TP-NVLS": tp / tt,
                                   "over cais-sw": sw / tt})
            # ---- energy per layer period ---------------------------------------------------
            for s in ("cais", "cais-sw", "tp-nvls"):
                if s not in t:
                    continue
                r = t[s]
                link_bits = (r["wire_up_GB"] + r["wire_down_GB"]) * r["gpus_run"] * 8e9
                link_uJ = link_bits * NVLINK_PJ_PER_BIT / 1e6
                lookups = r.get("merge_lookups", 0) or 0
                units = SWITCH_CHIPS * ports if s == "cais" else 0
                dyn_uJ = lookups * tim["access_pJ"] / 1e6
                leak_uJ = units * float(port.loc[nm, "leakage_mW"]) * 1e-3 * r["total_us"]  # mW x us = nJ; /1e3: uJ
                energy_rows.append({"world": w.label, "mode": mode, "scheme": s, "period_us": r["total_us"],
                                    "NVLink_uJ": link_uJ, "merge_lookups": int(lookups),
                                    "merge_dynamic_uJ": dyn_uJ, "merge_leakage_uJ": leak_uJ,
                                    "total_uJ": link_uJ + dyn_uJ + leak_uJ,
                                    "merge share": (dyn_uJ + leak_uJ) / (link_uJ + dyn_uJ + leak_uJ)})
    ladder, sweep, energy, be = (pd.DataFrame(x) for x in (ladder_rows, sweep_rows, energy_rows, be_rows))

    # ---- figures ------------------------------------------------------------------------------
    if len(sweep):
        lat = sweep[sweep["knob"] == "switch.merge.latency_ns"]
        series = {f"{w} {m} over {o}": (list(g["value"]), list(g[f"over {o}"]))
                  for (w, m), g in lat.groupby(["world", "mode"], sort=False) for o in ("TP-NVLS", "cais-sw")}
        plots.lines(ctx.out / "cost_latency.png", series, "merge latency added (ns)", "CAIS speedup (x)",
                    "CAIS's speedup against the merge unit's added latency", hline=1.0)
        rate = sweep[sweep["knob"] == "switch.merge.lookups_per_ns"]
        series = {f"{w} {m} over {o}": ([min(v, 100.0) for v in g["value"]], list(g[f"over {o}"]))
                  for (w, m), g in rate.groupby(["world", "mode"], sort=False) for o in ("TP-NVLS", "cais-sw")}
        plots.lines(ctx.out / "cost_rate.png", series, "lookups per port per ns (log; 100 = no limit)",
                    "CAIS speedup (x)", "CAIS's speedup against the merge unit's lookup rate", hline=1.0, logx=True,
                    vlines={f"CACTI {NODE}": tim["lookups_per_ns"]})

    # ---- the report -----------------------------------------------------------------------------
    sec.p(f"Model {one_model(ctx)['model']}, {P.SMS_HALF} SMs, one layer period per point; worlds: "
          + ", ".join(w.label for w in _worlds(ctx)) + f". Merge-unit figures: {source}.")
    a12 = float(chip.loc[12, "area_mm2"])
    hand = merge_unit_mm2(P.TABLE_KB_SIMULATED, "16/12 nm")
    sec.says(verdict(a12, tim, be, energy))
    sec.p("The ladder (one period, us, and the speedup over TP-NVLS; the last row is the switch's share of "
          "CAIS's gain over TP-NVLS, log(cais-sw/cais) / log(tp-nvls/cais)):")
    sec.table(ladder)
    sec.p(f"The merge unit's arrays (per port; the chip has {ports} GPU ports): CAM tags of "
          f"{run['tag_bits']} bits (a {run['address_bits']}-bit address less the 128 B line offset, plus the "
          f"request type), the content array's {run['entries']} x {run['line_bytes']} B lines, and "
          f"{run['meta_bits']} bits of merging-table state per entry (state, count, {ports - 1} waiting "
          f"requesters' port and {MU.TXN_TAG_BITS}-bit transaction tag). Below 22 nm the figures are CACTI's "
          "22 nm scaled by hwcomponents-cacti's rule (area and time x node, energy x sqrt(node), leakage x "
          "sqrt(node) x 0.79).")
    sec.table(pd.DataFrame([
        compare(f"merge units per switch chip, 12 nm, CACTI scaled (mm^2)", a12, P.AREA_SWITCH_MM2,
                "ours counts the arrays only (CACTI's periphery included); the paper's synthesis also has the "
                "reduction adders, the CAM's match logic beyond CACTI's and control"),
        compare("the same, the hand-written bit-cell model (mm^2)", hand, P.AREA_SWITCH_MM2,
                "bit cells over one array efficiency, no periphery (cais.reproduce.area)")]), summary=True)
    sec.table(table.round(5))
    sec.p(f"At {NODE}, what the simulation takes (switch.merge.cacti_node={NODE}): a lookup adds "
          f"{tim['latency_ns']:.3f} ns (CAM search, then the line's access) and a port starts "
          f"{tim['lookups_per_ns']:.2f} lookups per ns (one per cycle of its slowest array); a line access costs "
          f"at most {tim['access_pJ']:.1f} pJ (search, state read and write, line read and write).")
    if len(be):
        sec.p("Break-even: where CAIS's speedup falls to 1.0 as the merge unit's latency grows and as its "
              "lookup rate falls:")
        sec.table(be)
        sec.img("cost_latency.png").img("cost_rate.png")
        sec.table(sweep)
    if len(energy):
        sec.p(f"Energy per layer period (uJ): NVLink bits x {NVLINK_PJ_PER_BIT} pJ/bit ({NVLINK_SOURCE}); the "
              f"merge units' line lookups x {tim['access_pJ']:.1f} pJ and their leakage ({SWITCH_CHIPS} chips x "
              f"{ports} ports) over the period, at {NODE}.")
        sec.table(energy)
    out = pd.concat([ladder.assign(part="ladder"), table.assign(part="cost"), be.assign(part="break-even"),
                     sweep.assign(part="sweep"), energy.assign(part="energy")], ignore_index=True)
    return out, sec


def verdict(area12: float, tim: dict[str, float], be: pd.DataFrame, energy: pd.DataFrame) -> str:
    """The premise's verdict in one paragraph, every judgement from the numbers: the
    area against the paper's; CACTI's latency and rate against the break-even points
    over TP-NVLS; the merge units' share of CAIS's energy and CAIS's energy against
    cais-sw's and TP-NVLS's."""
    parts = [f"Area: the merge units' arrays take {area12:.2f} mm^2 per switch chip at 12 nm (CACTI 22 nm, "
             f"scaled) against the paper's {P.AREA_SWITCH_MM2:.2f} mm^2 for the whole unit, "
             + ("within it: CACTI does not contradict the area claim." if area12 <= P.AREA_SWITCH_MM2 else
                "above it: CACTI's arrays alone exceed the paper's figure.")]
    for knob, what, mine, worse in (("switch.merge.latency_ns", "latency", tim["latency_ns"], "ns added"),
                                    ("switch.merge.lookups_per_ns", "rate", tim["lookups_per_ns"], "lookups/ns")):
        b = be[(be["knob"] == knob) & (be["over"] == "TP-NVLS")] if len(be) else be
        if not len(b):
            continue
        cases = [f"{r['world']} {r['mode']}: {r['break-even']}" for _, r in b.iterrows()]
        fin = [x for x in b["break_even"] if x == x and not math.isinf(x)]
        lost = sum(1 for x in b["break_even"] if x == -math.inf)
        if what == "latency":
            margin = (min(fin) / mine if fin else float("nan"))
            ok = lost == 0 and (not fin or margin >= 10)  # an order of magnitude to spare
            head = f"Latency: CACTI's lookup adds {mine:.2f} ns at {NODE}"
            ex = [x for x in b.get("extrapolated_ns", pd.Series(dtype=float)) if x == x]
            tail = (f"; the nearest break-even is {margin:.0f}x CACTI's latency" if fin else
                    f" (a straight line through the sweep reaches 1.0 at {min(ex) / 1e3:.1f}-{max(ex) / 1e3:.1f} us, "
                    f"over {10 ** int(math.log10(min(ex) / mine)):,}x CACTI's latency)" if ex else "")
        else:
            margin = (mine / max(fin) if fin else float("nan"))
            ok = lost == 0 and (not fin or margin >= 2)
            head = f"Rate: a port starts {mine:.1f} lookups per ns at {NODE}"
            tail = f"; CACTI's rate is {margin:.1f}x the highest break-even" if fin else ""
        parts.append(f"{head}; CAIS's speedup over TP-NVLS falls to 1.0 at: " + "; ".join(cases) + tail + ": "
                     + ("the premise holds." if ok else "the premise is at risk." if lost == 0 else
                        "CAIS does not beat TP-NVLS here even at no cost."))
    c = energy[energy["scheme"] == "cais"] if len(energy) else energy
    if len(c):
        sh = list(c["merge share"])
        rel = []
        for other in ("cais-sw", "tp-nvls"):
            o = energy[energy["scheme"] == other]
            m = c.merge(o, on=["world", "mode"], suffixes=("", "_o"))
            if len(m):
                r = m["total_uJ"] / m["total_uJ_o"]
                rel.append(f"{min(r):.2f}-{max(r):.2f}x {other}'s" if min(r) != max(r) else f"{min(r):.2f}x {other}'s")
        parts.append(f"Power: the merge units take {100 * min(sh):.1f}-{100 * max(sh):.1f} % of CAIS's link and merge "
                     f"energy per period (links at a lower-bound {NVLINK_PJ_PER_BIT} pJ/bit), and CAIS's total is "
                     + " and ".join(rel) + ": "
                     + ("the power premise holds." if max(sh) < 0.1 else "the merge unit is a visible share."))
    return " ".join(parts)


EXPERIMENT = Experiment("cost", "cost", cost_points, cost_analyse)
