"""The event estimate of MoE layer periods (cais.experiments.estimates.moe_period_events)
against the events the runs really take: within the band docs/errors.md states
("Size limits"), on small runs of every shipped EP scheme in every mode, and such that
an nvl72 EP-72 DeepSeek-V3 layer (whose real counts are below the limit) is not refused."""

from __future__ import annotations

import pytest

from cais.config import load_system
from cais.experiments.estimates import moe_period_events
from cais.experiments.layer import run_layer
from cais.kernels.ep_registry import EP_KERNELS
from cais.limits import DEFAULT_MAX_EVENTS
from cais.workload.moe import load_moe_model
from cais.workload.moe_dataflow import attention_model, build_moe_period

#: the band every measured run fell in (docs/errors.md, "Size limits")
LOW, HIGH = 0.5, 5.0
SHIPPED = ("nccl", "allgather", "deepep", "deepep-ll")


@pytest.mark.parametrize("mode", ("prefill", "decode", "train"))
@pytest.mark.parametrize("kernel", SHIPPED)
def test_estimate_bounds_the_real_count(kernel: str, mode: str) -> None:
    cfg = load_system("dgx-h100")
    model = load_moe_model("qwen3-30b-a3b", seq=64, batch=1)
    period = build_moe_period(model, cfg.gpus, mode, "dp", 0)
    estimate = moe_period_events(cfg, period, attention_model(model).dtype_bytes, EP_KERNELS[kernel])
    real = run_layer(cfg, model, f"ep-{kernel}", mode, attention="dp").events
    assert real > 1000
    assert LOW <= estimate / real <= HIGH


def test_the_exchange_is_what_the_estimate_follows() -> None:
    """The same layer with four times the tokens: the low-latency kernel's estimate
    grows with its one store per (token, expert), the decode step's does not."""
    cfg = load_system("dgx-h100")
    grow = []
    for seq in (64, 256):
        model = load_moe_model("qwen3-30b-a3b", seq=seq, batch=1)
        period = build_moe_period(model, cfg.gpus, "prefill", "dp", 0)
        grow.append(moe_period_events(cfg, period, 2, EP_KERNELS["deepep-ll"]))
    assert grow[1] > 3 * grow[0]


@pytest.mark.parametrize("kernel,mode", [("deepep", "train"), ("deepep", "prefill"), ("deepep-ll", "train"),
                                         ("nccl", "train"), ("deepep", "decode")])
def test_nvl72_ep72_layer_fits_the_default_limit(kernel: str, mode: str) -> None:
    """DeepSeek-V3 (288 experts: 256 and 32 redundant copies) at EP 72, 64 tokens per GPU,
    attention data parallel: its measured counts (docs/moe.md, "Speed") are below the
    default limit, and so is the estimate, so it runs without CAIS_MAX_EVENTS."""
    cfg = load_system("nvl72")
    model = load_moe_model("deepseek-v3", seq=64, batch=1, experts=288)
    period = build_moe_period(model, cfg.gpus, mode, "dp", 0)
    estimate = moe_period_events(cfg, period, attention_model(model).dtype_bytes, EP_KERNELS[kernel])
    assert 1e5 < estimate < DEFAULT_MAX_EVENTS
