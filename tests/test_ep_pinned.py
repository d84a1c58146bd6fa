"""The EP kernels' simulated times, pinned (picoseconds), so that any change of a
simulated number by speed work fails here. First recorded before the speed work of
issue 66 (vectorised layouts, the routing's top-k by partition, the copy loops'
bookkeeping) on commit ed88b55; re-recorded when the NVSwitch presets moved to a VC per
destination and the EP constants were refitted on it (commit 0479d80 and its successor),
which moved every time on purpose. Also the routings' digests
(the draws every EP time rests on) and whole MoE layers under each shipped EP scheme.

Each case: (kernel, op, system, EP ranks, tokens per rank, dtype, run_ep options,
time in ps); DeepSeek-V3's rows (hidden 7,168, top-8, (256 // EP) x EP experts)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from cais.config import PS_PER_US, load_system
from cais.experiments.ep import run_ep
from cais.experiments.layer import run_layer
from cais.experiments.spec import SystemSpec
from cais.workload.moe import load_moe_model
from cais.workload.routing import generate

HIDDEN, TOPK = 7168, 8

PINNED: list[tuple[str, str, str, int, int, str, dict[str, Any], int]] = [
    ('nccl', 'dispatch', 'dgx-h100', 8, 1, 'bf16', {}, 11776167),
    ('nccl', 'dispatch', 'dgx-h100', 8, 128, 'bf16', {}, 50127488),
    ('nccl', 'dispatch', 'hgx-h800', 4, 16, 'bf16', {}, 20001920),
    ('nccl', 'dispatch', 'dgx-h100', 2, 1024, 'bf16', {}, 202847008),
    ('nccl', 'combine', 'dgx-h100', 8, 1, 'bf16', {}, 11854119),
    ('nccl', 'combine', 'dgx-h100', 8, 128, 'bf16', {}, 49530400),
    ('nccl', 'combine', 'hgx-h800', 4, 16, 'bf16', {}, 19603520),
    ('nccl', 'combine', 'dgx-h100', 2, 1024, 'bf16', {}, 201910208),
    ('allgather', 'dispatch', 'dgx-h100', 8, 1, 'bf16', {}, 14629671),
    ('allgather', 'dispatch', 'dgx-h100', 8, 128, 'bf16', {}, 49906133),
    ('allgather', 'dispatch', 'hgx-h800', 4, 16, 'bf16', {}, 18127571),
    ('allgather', 'dispatch', 'dgx-h100', 2, 1024, 'bf16', {}, 52938208),
    ('allgather', 'combine', 'dgx-h100', 8, 1, 'bf16', {}, 14629671),
    ('allgather', 'combine', 'dgx-h100', 8, 128, 'bf16', {}, 49906133),
    ('allgather', 'combine', 'hgx-h800', 4, 16, 'bf16', {}, 18127571),
    ('allgather', 'combine', 'dgx-h100', 2, 1024, 'bf16', {}, 52938208),
    ('deepep', 'dispatch', 'dgx-h100', 8, 1, 'bf16', {}, 10648293),
    ('deepep', 'dispatch', 'dgx-h100', 8, 128, 'bf16', {}, 81459971),
    ('deepep', 'dispatch', 'hgx-h800', 4, 16, 'bf16', {}, 16264168),
    ('deepep', 'dispatch', 'dgx-h100', 2, 1024, 'bf16', {}, 191945704),
    ('deepep', 'combine', 'dgx-h100', 8, 1, 'bf16', {}, 11671782),
    ('deepep', 'combine', 'dgx-h100', 8, 128, 'bf16', {}, 81485215),
    ('deepep', 'combine', 'hgx-h800', 4, 16, 'bf16', {}, 15915692),
    ('deepep', 'combine', 'dgx-h100', 2, 1024, 'bf16', {}, 192158474),
    ('deepep-ll', 'dispatch', 'dgx-h100', 8, 1, 'bf16', {}, 30161690),
    ('deepep-ll', 'dispatch', 'dgx-h100', 8, 128, 'bf16', {}, 77857582),
    ('deepep-ll', 'dispatch', 'hgx-h800', 4, 16, 'bf16', {}, 37653120),
    ('deepep-ll', 'dispatch', 'dgx-h100', 2, 1024, 'bf16', {}, 281469130),
    ('deepep-ll', 'combine', 'dgx-h100', 8, 1, 'bf16', {}, 29801570),
    ('deepep-ll', 'combine', 'dgx-h100', 8, 128, 'bf16', {}, 74276946),
    ('deepep-ll', 'combine', 'hgx-h800', 4, 16, 'bf16', {}, 38646149),
    ('deepep-ll', 'combine', 'dgx-h100', 2, 1024, 'bf16', {}, 268325759),
    ('deepep', 'dispatch', 'hgx-h800', 8, 128, 'fp8', {}, 56439159),
    ('deepep-ll', 'dispatch', 'hgx-h800', 8, 128, 'fp8', {}, 75692612),
    ('deepep', 'dispatch', 'dgx-h100', 8, 64, 'bf16', {'host_sync': True, 'chunk': 10}, 62675138),
    ('nccl', 'dispatch', 'dgx-h100', 4, 64, 'bf16', {'host_sync': True, 'routing': 'powerlaw'}, 45219712),
    ('deepep-ll', 'combine', 'dgx-h100', 8, 32, 'bf16', {'routing': 'lognormal', 'seed': 3}, 52827580),
    ('deepep', 'combine', 'hgx-h800', 8, 48, 'bf16', {'routing': 'uniform', 'n_group': 8, 'topk_group': 4, 'sms': 20}, 43819336),
    ('nccl', 'combine', 'dgx-h100', 8, 40, 'bf16', {'capacity_factor': 1.0, 'capacity': 'drop'}, 21304160),
    ('ep-switch', 'dispatch', 'dgx-h100', 8, 64, 'bf16', {}, 17975705),
    ('ep-switch', 'combine', 'dgx-h100', 8, 64, 'bf16', {}, 57527474),
    ('ep-switch-sw', 'dispatch', 'dgx-h100', 8, 64, 'bf16', {}, 49125713),
    ('ep-switch-sw', 'combine', 'dgx-h100', 8, 64, 'bf16', {}, 59073946),
]

#: (ranks, tokens, experts, top-k, seed, generator, n_group, topk_group) -> sha256 prefix of
#: the routing's expert ids (int64) and gate weights (float64), little-endian
ROUTINGS: list[tuple[tuple[int, int, int, int, int, str, int, int], str]] = [
    ((8, 64, 256, 8, 0, 'uniform', 1, 1), 'dc4334269bc6deaf'),
    ((8, 512, 256, 8, 1, 'uniform', 8, 4), '1caee086df2b9979'),
    ((4, 33, 64, 6, 2, 'powerlaw', 1, 1), '3194a8546eef3faa'),
    ((2, 100, 16, 2, 5, 'lognormal', 1, 1), '0f01f3adbc4c263f'),
    ((8, 3, 64, 8, 0, 'uniform', 4, 2), '52798d5f526f7dcc'),
    ((1, 7, 8, 8, 0, 'uniform', 1, 1), '82c908a66d332246'),
]

#: qwen3-30b-a3b, 32 tokens per GPU (batch 1), attention data parallel, dgx-h100: the
#: period's total (us) under each shipped EP scheme
LAYERS: list[tuple[str, str, float]] = [
    ('ep-nccl', 'train', 915.074099),
    ('ep-nccl', 'decode', 239.994621),
    ('ep-allgather', 'train', 921.58514),
    ('ep-allgather', 'decode', 234.33652),
    ('ep-deepep', 'train', 896.352739),
    ('ep-deepep', 'decode', 218.694111),
    ('ep-deepep-ll', 'train', 896.786307),
    ('ep-deepep-ll', 'decode', 223.718986),
]


@pytest.mark.parametrize("case", PINNED, ids=lambda c: "-".join(str(x) for x in c[:6]))
def test_ep_time_is_pinned(case: tuple[str, str, str, int, int, str, dict[str, Any], int]) -> None:
    kernel, op, system, gpus, tokens, dtype, options, ps = case
    cfg = SystemSpec(system, gpus).build()[0]
    r = run_ep(cfg, kernel, op, tokens, HIDDEN, TOPK, (256 // gpus) * gpus, dtype, **options)
    assert r.events > 0
    assert round(r.time_us * PS_PER_US) == ps


@pytest.mark.parametrize("case", ROUTINGS, ids=lambda c: "-".join(str(x) for x in c[0]))
def test_routing_draw_is_pinned(case: tuple[tuple[int, int, int, int, int, str, int, int], str]) -> None:
    (ranks, tokens, experts, topk, seed, kind, n_group, topk_group), digest = case
    rt = generate(kind, ranks, tokens, experts, topk, seed, n_group=n_group, topk_group=topk_group)
    assert rt.topk_idx.shape == (ranks, tokens, topk)
    got = hashlib.sha256(rt.topk_idx.astype("<i8").tobytes() + rt.weights.astype("<f8").tobytes()).hexdigest()
    assert got[:16] == digest


@pytest.mark.parametrize("case", LAYERS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_moe_layer_time_is_pinned(case: tuple[str, str, float]) -> None:
    scheme, mode, total_us = case
    model = load_moe_model("qwen3-30b-a3b", seq=32, batch=1)
    r = run_layer(load_system("dgx-h100"), model, scheme, mode, attention="dp")
    assert r.total_us == total_us
