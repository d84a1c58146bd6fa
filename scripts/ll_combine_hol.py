"""Why DeepEP's low-latency combine misses (docs/moe.md, "The low-latency combine miss"):
the model's own telemetry on the fit row (hgx-h800, EP 8, 128 tokens per rank, hidden
7,168, top-8 of 288, BF16), and one counterfactual.

* Telemetry (cais.results.Recorder, 2 us bins over the combine): how many of the 8
  destination GPUs' down-links are busy (over half the bin) at a time, the busiest
  down-link's utilisation, and how many of the switch input VCs in use sit full (at
  least 95 % of their buffer) over most of the first 80 us.
* Counterfactual: the same kernel with each block's stores on a VC of their own
  destination (``link.vc_policy`` = kernel, the block's stream = its destination rank),
  which gives every switch input a queue per destination (as virtual output queues
  would): if head-of-line blocking in the input FIFOs is the cause, the time falls.

    PYTHONPATH=src .venv/bin/python scripts/ll_combine_hol.py [--tokens 128]

docs/moe.md's numbers come from this script; tests/test_moe_layer.py checks them.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from cais.config import PS_PER_US, apply_overrides, load_system
from cais.kernels import ep_common, ep_deepep_ll
from cais.kernels.ep_common import EpCall
from cais.machine import Machine
from cais.results import Recorder
from cais.workload.routing import generate

BIN_PS = 2_000_000


def _run(tokens: int, per_destination: bool, record: bool) -> tuple[float, Recorder | None, Any]:
    cfg = load_system("hgx-h800")
    if per_destination:
        cfg = apply_overrides(cfg, {"link.vc_policy": "kernel"})
    rt = generate("uniform", 8, tokens, 288, 8, 0)  # the fit row: 288 experts
    call = EpCall("combine", rt, 7168, "bf16")
    rec = Recorder(bin_ps=BIN_PS, links=True, tbs=False, buffers=True, merge=False) if record else None
    m = Machine(cfg, recorder=rec)
    orig = ep_common.copy_tb

    def by_destination(m_: Machine, g: int, call_: EpCall, moves: Any, before: Any = (), after: Any = None,
                       start_ps: int = 0, stream: int = 0, **kw: Any) -> Any:
        dst = next((mv.dst for mv in moves if mv.dst != g), g)
        return orig(m_, g, call_, moves, before, after, start_ps, stream=1 + dst, **kw)
    if per_destination:
        ep_deepep_ll.copy_tb = by_destination  # type: ignore[assignment]
    try:
        ks = ep_deepep_ll.kernels(m, call)
    finally:
        ep_deepep_ll.copy_tb = orig  # type: ignore[assignment]
    for gpu, k in zip(m.gpus, ks):
        gpu.launch(k, m.launch_ps)
    m.run()
    return max(k.finished_at or 0 for k in ks) / PS_PER_US, rec, cfg


def diagnose(tokens: int = 128) -> dict[str, float]:
    """The combine's time with the presets' VCs and with a VC per destination, and the
    telemetry of the first (module doc)."""
    t_class, rec, cfg = _run(tokens, False, True)
    t_dest, _, _ = _run(tokens, True, False)
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
    return {"tokens": tokens, "combine_us": t_class, "combine_per_destination_vc_us": t_dest,
            "busy_destinations_first_half": float((first > 0.5).sum(axis=1).mean()),
            "busiest_down_link_first_half": float(first.max(axis=1).mean()),
            "input_vcs_used": used, "input_vcs_full": full}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    d = diagnose(ap.parse_args().tokens)
    for k, v in d.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")


if __name__ == "__main__":
    main()
