"""DeepEP's low-latency combine and the switch's input queues (docs/moe.md, "The
low-latency combine and head-of-line blocking"): the model's own telemetry on the fit
row (hgx-h800, EP 8, 128 tokens per rank, hidden 7,168, top-8 of 288, BF16) with a VC
per traffic class, the presets' VC per destination, and a time budget.

* Telemetry (cais.results.Recorder, 2 us bins over the combine) with a VC per traffic
  class (``link.vc_policy`` = class, 8 VCs: the presets before the destination policy):
  how many of the 8 destination GPUs' down-links are busy (over half the bin) at a
  time, the busiest down-link's utilisation, and how many of the switch input VCs in
  use sit full (at least 95 % of their buffer) over most of the first 80 us.
* The presets (``link.vc_policy`` = destination, 18 VCs: every switch input queues per
  destination): if head-of-line blocking in the class queues is the cause, the time
  falls.
* Budget (``--budget``): what the combine takes with the fabric at link rate (launch,
  the fixed cost, the busiest GPU's rows on the wire, one block's reduction), and the
  time case by case (:data:`BUDGET_CASES`: VCs per class or per destination, VC count,
  buffer per VC, the per-block in-flight window), each with when the last block's
  sends landed, the rest to the end, and how busy the down-links were while they ran.

    PYTHONPATH=src .venv/bin/python scripts/ll_combine_hol.py [--tokens 128] [--budget]

docs/moe.md's numbers come from this script; tests/test_moe_layer.py checks them.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from cais.config import PS_PER_US, apply_overrides, load_system
from cais.kernels import ep_common, ep_deepep_ll
from cais.kernels.ep_common import EpCall
from cais.hw.packets import Kind, Packetizer
from cais.machine import Machine
from cais.results import Recorder
from cais.workload.routing import generate

BIN_PS = 2_000_000


#: a VC per traffic class on 8 VCs (the presets before the destination policy)
BY_CLASS = {"link.vc_policy": "class", "link.vcs": "8"}


def _run(tokens: int, record: bool, overrides: dict[str, str] | None = None,
         phases: dict[str, list[float]] | None = None) -> tuple[float, Recorder | None, Any]:
    """The fit row's combine: its time (us), the recorder (``record``) and the system.
    ``overrides``: config overrides on hgx-h800 (``apply_overrides``); ``phases``:
    filled, when given, with each block's times (us) when its sends have landed
    (``sent``), when every peer's count has landed at its GPU (``ready``) and when its
    reduction ends (``end``)."""
    cfg = load_system("hgx-h800")
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    rt = generate("uniform", 8, tokens, 288, 8, 0)  # the fit row: 288 experts
    call = EpCall("combine", rt, 7168, "bf16")
    rec = Recorder(bin_ps=BIN_PS, links=True, tbs=False, buffers=True, merge=False) if record else None
    m = Machine(cfg, recorder=rec)
    orig_recv = ep_deepep_ll._recv

    def timed(m_: Machine, g: int, call_: EpCall, s: int, blocks: int, ready: Any, mine: Any) -> Any:
        inner = orig_recv(m_, g, call_, s, blocks, ready, mine)
        assert phases is not None
        if s == 0:
            ready.on_fire(lambda _v: phases["ready"].append(m_.sim.now / PS_PER_US))

        def after() -> Any:
            phases["sent"].append(m_.sim.now / PS_PER_US)
            yield from inner()
            phases["end"].append(m_.sim.now / PS_PER_US)
        return after
    if phases is not None:
        phases.update(sent=[], ready=[], end=[])
        ep_deepep_ll._recv = timed  # type: ignore[assignment]
    try:
        ks = ep_deepep_ll.kernels(m, call)
    finally:
        ep_deepep_ll._recv = orig_recv  # type: ignore[assignment]
    for gpu, k in zip(m.gpus, ks):
        gpu.launch(k, m.launch_ps)
    m.run()
    return max(k.finished_at or 0 for k in ks) / PS_PER_US, rec, cfg


def diagnose(tokens: int = 128) -> dict[str, float]:
    """The combine's time with a VC per traffic class and with the presets' VC per
    destination, and the telemetry of the first (module doc)."""
    t_class, rec, cfg = _run(tokens, True, BY_CLASS)
    t_dest, _, _ = _run(tokens, False)
    assert rec is not None
    util = rec.link_util_bins()
    nb = len(next(iter(util.values())))
    dest = np.array([[np.mean([util[f"sw{c}->gpu{g}"][b] for c in range(cfg.switch.chips)]) for g in range(8)]
                     for b in range(nb)])
    busy = dest[dest.sum(axis=1) > 0]
    first = busy[: max(1, len(busy) // 2)]
    depth_bytes = cfg.link.vc_depth_flits * cfg.packet.flit_bytes * 2  # 2 links per GPU per chip on hgx-h800
    window = slice(10, 40)  # 20-80 us
    used = full = 0
    for name, vcs in rec.buffer_peak_bins().items():
        if name.startswith("gpu"):  # the switch's input buffers from a GPU
            for arr in vcs:
                if arr.max() > 0:
                    used += 1
                    full += int((arr[window] >= 0.95 * depth_bytes).mean() > 0.5)
    return {"tokens": tokens, "combine_by_class_us": t_class, "combine_us": t_dest,
            "busy_destinations_first_half": float((first > 0.5).sum(axis=1).mean()),
            "busiest_down_link_first_half": float(first.max(axis=1).mean()),
            "input_vcs_used": used, "input_vcs_full": full}


#: the budget's cases: (name, config overrides on hgx-h800)
BUDGET_CASES: tuple[tuple[str, dict[str, str]], ...] = (
    ("presets", {}),  # 18 VCs, a VC per destination (9 request VCs: loads, flags, the 7 peers)
    ("class_8", BY_CLASS),  # a VC per class on 8 VCs
    ("class_18", {"link.vc_policy": "class"}),  # the presets' VCs (and buffer), one per class
    ("destination_16", {"link.vcs": "16"}),  # 8 request VCs: 6 for the 7 peers, so two share
    ("destination_8", {"link.vcs": "8"}),  # 4 request VCs: 2 for the 7 peers
    ("destination_same_buffer", {"link.vc_depth_flits": "455"}),  # class_8's buffer per link over 18 VCs
    ("destination_window_16k", {"collective.outstanding_bytes_per_sm": "16384"}),
    ("destination_window_unbounded", {"collective.outstanding_bytes_per_sm": str(1 << 30)}),
)


def link_bound_us(tokens: int = 128) -> dict[str, float]:
    """What the fit row's combine needs beyond the fabric at link rate: the busiest GPU's
    remote rows (out or in) on the wire at its NVLink rate (the packet format's bytes),
    and, from the kernel's constants, the fixed cost and one block's reduction (its
    tokens' top-k rows at the SM copy rate)."""
    cfg = load_system("hgx-h800")
    rt = generate("uniform", 8, tokens, 288, 8, 0)
    call = EpCall("combine", rt, 7168, "bf16")
    mat = rt.matrix("expert")  # [source][expert rank] selections: combine sends them back
    np.fill_diagonal(mat, 0)
    rows = max(int(mat.sum(axis=0).max()), int(mat.sum(axis=1).max()))
    wire, _ = Packetizer(cfg.packet).wire(int(Kind.WRITE), call.row_bytes)
    raw_GBps = cfg.link.bandwidth_GBps * sum(cfg.switch.links_per_gpu)
    blocks, _ = ep_deepep_ll.launch_shape(288, cfg.gpu.sms)
    per_block = max(int((rt.topk_idx[g, list(range(s, tokens, blocks))] >= 0).sum())
                    for g in range(8) for s in range(min(blocks, tokens)))
    return {"links_us": rows * wire / raw_GBps / 1e3, "fixed_us": call.consts.ll_fixed_us,
            "reduce_us": ep_common.copy_time_ps(call, per_block * call.row_bytes) / PS_PER_US,
            "launch_us": cfg.gpu.kernel_launch_us, "blocks": blocks}


def budget(tokens: int = 128) -> dict[str, dict[str, float]]:
    """Where the fit row's combine time goes, case by case (:data:`BUDGET_CASES`): the
    time, when the last block's sends have landed, the span from then to the end (the
    wait for the counts and the receiver's reduction), and the mean utilisation of the
    destination GPUs' down-links while the sends run."""
    out: dict[str, dict[str, float]] = {}
    for name, over in BUDGET_CASES:
        ph: dict[str, list[float]] = {}
        t, rec, cfg = _run(tokens, True, over, ph)
        assert rec is not None
        util = rec.link_util_bins()
        sent = max(ph["sent"])
        nb = min(len(next(iter(util.values()))), max(1, int(sent * PS_PER_US // BIN_PS)))
        down = np.mean([[util[f"sw{c}->gpu{g}"][b] for c in range(cfg.switch.chips) for g in range(8)]
                        for b in range(nb)])
        out[name] = {"combine_us": t, "sent_us": sent, "after_sent_us": t - sent,
                     "down_link_util": float(down)}
    return out


#: what docs/moe.md calls each budget case
CASE_NAMES = {
    "presets": "the presets (a VC per destination, 18 VCs of 1,024 flits)",
    "class_8": "a VC per traffic class, 8 VCs (the presets before)",
    "class_18": "a VC per traffic class, 18 VCs",
    "destination_16": "a VC per destination on 16 VCs (the 7 peers share 6 request VCs)",
    "destination_8": "a VC per destination on 8 VCs (the 7 peers share 2 request VCs)",
    "destination_same_buffer": "a VC per destination, 455 flits per VC (the class presets' buffer per link)",
    "destination_window_16k": "a VC per destination, in-flight window per block 16 KB (presets: 64 KB)",
    "destination_window_unbounded": "a VC per destination, in-flight window unbounded",
}


def budget_doc(b: dict[str, float], rows: dict[str, dict[str, float]]) -> str:
    """docs/moe.md's budget from :func:`link_bound_us` and :func:`budget`: the sum at
    link rate, then the cases' table."""
    total = b["launch_us"] + b["fixed_us"] + b["links_us"] + b["reduce_us"]
    lines = [f"launch {b['launch_us']:.1f} + fixed {b['fixed_us']:.1f} + links {b['links_us']:.1f} + "
             f"reduction {b['reduce_us']:.1f} = {total:.1f} us", "",
             "| case | combine (us) | last sends landed (us) | then to the end (us) | down-links busy |",
             "|---|---:|---:|---:|---:|"]
    for name, row in rows.items():
        lines.append(f"| {CASE_NAMES[name]} | {row['combine_us']:.1f} | {row['sent_us']:.1f} | "
                     f"{row['after_sent_us']:.1f} | {100 * row['down_link_util']:.0f} % |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--budget", action="store_true", help="also the time budget's cases (module doc)")
    args = ap.parse_args()
    d = diagnose(args.tokens)
    for k, v in d.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    if args.budget:
        print(budget_doc(link_bound_us(args.tokens), budget(args.tokens)))


if __name__ == "__main__":
    main()
