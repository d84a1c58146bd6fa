"""The production all-reduce kernels (kernels/production_ar.py) and their schemes:
wire bytes per GPU against the closed forms of the module docstring, exact sums in
functional mode, the path each source picks by size, conservation, and the layer's
fallback to NCCL where the source falls back."""

import numpy as np
import pytest

from cais.experiments.collective import run_collective
from cais.experiments.layer import run_layer
from cais.config import load_system
from cais.kernels import production_ar as pa
from cais.kernels.collectives import CollectiveSpec, build
from cais.machine import Machine
from cais.workload.models import ModelSpec

#: payload bytes per GPU as multiples of the buffer S: (GPU -> switch, switch -> GPU)
CLOSED_FORMS = {
    "custom-oneshot": (lambda n: n - 1, lambda n: n - 1),
    "custom-twoshot": (lambda n: 2 * (n - 1) / n, lambda n: 2 * (n - 1) / n),
    "multimem-oneshot": (lambda n: n, lambda n: 1),
    "multimem-twoshot": (lambda n: (n + 1) / n, lambda n: (n + 1) / n),
    "fused-oneshot": (lambda n: n - 1, lambda n: n - 1),
    "fused-twoshot": (lambda n: 2 * (n - 1) / n, lambda n: 2 * (n - 1) / n),
}


@pytest.fixture(scope="module")
def h100():
    return load_system("dgx-h100")


def _payload_per_gpu(m: Machine) -> tuple[list[int], list[int]]:
    up = [sum(ch.payload_bytes for ch in row) for row in m.fabric.up]
    down = [sum(m.fabric.down[c][g].payload_bytes for c in range(len(m.fabric.down))) for g in range(m.n)]
    return up, down


def _run(cfg, algo: str, count: int) -> tuple[Machine, list]:
    m = Machine(cfg)
    kernels = build(m, CollectiveSpec("allreduce", algo, count))
    for gpu, k in zip(m.gpus, kernels):
        gpu.launch(k)
    m.run()
    return m, kernels


@pytest.mark.parametrize("algo", sorted(CLOSED_FORMS))
@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("tokens", [8, 24])  # whole rows per GPU
def test_wire_bytes_per_gpu_are_the_closed_form(h100, algo, n, tokens) -> None:
    count = tokens * 4096  # whole 4096-element token rows (the fused kernel's row), as many per GPU
    size = 2 * count
    m, kernels = _run(h100.with_overrides(gpus=n), algo, count)
    assert all(k.name == f"{algo}-allreduce" for k in kernels)  # the path under test ran
    up, down = _payload_per_gpu(m)
    f_up, f_down = CLOSED_FORMS[algo]
    assert up == [round(size * f_up(n))] * n
    assert down == [round(size * f_down(n))] * n
    assert m.conservation().ok


@pytest.mark.parametrize("algo", ["custom-oneshot", "custom-twoshot", "custom", "multimem-oneshot",
                                  "multimem-twoshot", "multimem", "fused-oneshot", "fused-twoshot", "fused"])
@pytest.mark.parametrize("n", [4, 8])
def test_every_gpu_gets_the_exact_sum(h100, algo, n) -> None:
    # 1 KiB units; the fused kernel on whole 4096-element rows, the others on a size
    # that is not a multiple of the unit, the blocks or the GPUs
    cfg = h100.with_overrides(gpus=n, transfer_unit_bytes=1024, min_transfer_unit_bytes=1024,
                              collective_unit_bytes=1024)
    nbytes = 2 * 4096 * 3 if algo.startswith("fused") else 2 * (n * 4099 + 3)
    r = run_collective(cfg, "allreduce", algo, nbytes, functional=True, seed=n)
    assert r.correct is True
    assert r.conservation.ok


def test_a_missing_contribution_is_caught(h100) -> None:
    """The functional check can fail: a GPU whose input is zeroed after the
    expected sums were taken leaves every GPU with a wrong sum."""
    m = Machine(h100.with_overrides(gpus=4), functional=True)
    rng = np.random.default_rng(1)
    count = 4 * 8192
    inputs = [rng.integers(-9, 9, count).astype(np.float64) for _ in range(4)]
    for gpu, x in zip(m.gpus, inputs):
        gpu.memory.alloc("send", count, fill=x)
        gpu.memory.alloc("recv", count)
    m.gpus[3].memory.buffers["send"][:] = 0
    for gpu, k in zip(m.gpus, build(m, CollectiveSpec("allreduce", "custom-twoshot", count))):
        gpu.launch(k)
    m.run()
    assert not np.array_equal(m.gpus[0].memory.buffers["recv"], np.sum(inputs, axis=0))


@pytest.mark.parametrize("n,threshold", [(4, 512 * 1024), (8, 256 * 1024)])
def test_custom_switches_to_two_shot_at_vllms_threshold(h100, n, threshold) -> None:
    cfg = h100.with_overrides(gpus=n)
    for nbytes, path in ((threshold - 16, "oneshot"), (threshold, "twoshot")):
        m = Machine(cfg)
        kernels = build(m, CollectiveSpec("allreduce", "custom", nbytes // 2))
        assert kernels[0].name == f"custom-{path}-allreduce"
    assert pa.custom_path(2, 64 << 20) == "oneshot"  # two GPUs: always one-shot


def test_launch_shapes_are_the_sources() -> None:
    assert pa.custom_blocks(16 * 512) == 1 and pa.custom_blocks(1 << 20) == 36  # 512 threads x 16 B, at most 36
    assert pa.multimem_blocks(8 * 16384, 8) == 1 and pa.multimem_blocks(1 << 20, 8) == 8  # 1024 x 16 B, at most 8
    assert pa.multimem_blocks(1 << 20, 1) == 8 and pa.multimem_blocks(16384, 1) == 1
    assert pa.fused_path(128) == "oneshot" and pa.fused_path(129) == "twoshot"
    assert pa.fused_grid(1, 4096, 8, 132) == 4  # decode: one token, a cluster of 4 blocks of 128 threads
    assert pa.fused_grid(4096, 4096, 8, 132) == 132  # prefill: every SM
    assert pa.custom_runs(8, (8 << 20) - 16) and not pa.custom_runs(8, 8 << 20) and not pa.custom_runs(16, 1024)
    assert pa.multimem_runs(8, 64 << 20) and not pa.multimem_runs(8, (64 << 20) + 4) and not pa.multimem_runs(2, 4)


def test_fused_switches_to_two_shot_above_128_tokens(h100) -> None:
    for tokens, path in ((128, "oneshot"), (129, "twoshot")):
        m = Machine(h100)
        assert build(m, CollectiveSpec("allreduce", "fused", tokens * 4096))[0].name == f"fused-{path}-allreduce"


MID = ModelSpec(name="mid", family="llama", hidden=1024, ffn_hidden=2048, heads=8, kv_heads=8, layers=2,
                gated_mlp=True, norm="rmsnorm", activation="swiglu", seq=128, batch=1)


@pytest.mark.parametrize("scheme,seq,ran", [
    ("tp-custom-ar", 64, "custom-oneshot/simple"),  # 128 KiB < 256 KiB
    ("tp-custom-ar", 1024, "custom-twoshot/simple"),  # 2 MiB
    ("tp-multimem", 1024, "multimem-twoshot/simple"),
    ("tp-fused-ar-norm", 64, "fused-oneshot/simple"),  # 64 tokens
    ("tp-fused-ar-norm", 1024, "fused-twoshot/simple"),
])
def test_the_scheme_runs_its_kernel_at_its_sizes(h100, scheme, seq, ran) -> None:
    r = run_layer(h100, MID.with_run(seq=seq), scheme, "prefill")
    assert r.collectives_ran == {ran: 2}  # both sub-layers' all-reduces


def test_custom_ar_falls_back_to_nccl_at_vllms_max_size(h100) -> None:
    r = run_layer(h100, MID.with_run(seq=4096), "tp-custom-ar", "prefill")  # 8 MiB: not below max_size
    assert not any(k.startswith("custom") for k in r.collectives_ran) and sum(r.collectives_ran.values()) == 2


def test_a_production_scheme_that_hands_every_allreduce_to_nccl_is_tp_nccl_event_for_event(h100) -> None:
    """Where vLLM's custom all-reduce hands both AllReduces to NCCL (8 MiB: not below
    its max size), the scheme says its run is tp-nccl's (NCCL's own
    choice per call), and the two runs agree in
    everything but the scheme's name; where its kernel runs, or where the multimem
    kernel runs, it says its own name (so a sweep runs both)."""
    from cais.schemes import get_scheme

    big, small = MID.with_run(seq=4096), MID.with_run(seq=1024)
    custom, multimem = get_scheme("tp-custom-ar"), get_scheme("tp-multimem")
    assert custom.same_run_as(big, 8, "prefill") == "tp-nccl"
    assert custom.same_run_as(small, 8, "prefill") == "tp-custom-ar"
    assert multimem.same_run_as(big, 8, "prefill") == "tp-multimem"  # up to 64 MiB on 8 GPUs
    assert multimem.same_run_as(big, 2, "prefill") == "tp-nccl"  # 2 GPUs: vLLM calls NCCL
    from cais.schemes import _discover

    others = [name for name in _discover() if name not in ("tp-custom-ar", "tp-multimem")]
    assert len(others) > 10 and all(get_scheme(s).same_run_as(big, 2, "prefill") == s for s in others)
    mine, nccl = (run_layer(h100, big, s, "prefill") for s in ("tp-custom-ar", "tp-nccl"))
    assert mine.events == nccl.events > 0 and mine.total_us == nccl.total_us
    assert mine.collectives_ran == nccl.collectives_ran == {"nvls/simple": 2}  # NCCL picks NVLS at 8 MiB


def test_a_production_scheme_s_nccl_fallback_is_nccl_s_own_choice_on_every_preset() -> None:
    """The fallback is NCCL's own algorithm and protocol by size (tp-nccl's run), also
    on a preset whose layer collectives are the scheme's (layer_choice = scheme),
    where tp-nvls runs NVLS in Simple: on 2 GPUs (vLLM calls NCCL) a 128 KiB decode
    all-reduce goes Ring/LL, as NCCL picks it."""
    paper = load_system("dgx-h100-paper", gpus=2)
    assert paper.collective.layer_choice == "scheme"
    small = MID.with_run(batch=64, seq=1024)  # decode: 64 token rows x 1024 x 2 B = 128 KiB per all-reduce
    mine = run_layer(paper, small, "tp-multimem", "decode")
    nccl = run_layer(paper, small, "tp-nccl", "decode")
    nvls = run_layer(paper, small, "tp-nvls", "decode")
    assert mine.collectives_ran == nccl.collectives_ran == {"ring/ll": 2}
    assert mine.events == nccl.events and mine.total_us == nccl.total_us
    assert nvls.collectives_ran == {"nvls/simple": 2} and nvls.total_us != nccl.total_us
    a, b = mine.as_json(), nccl.as_json()
    assert set(a) == set(b) and {k for k in a if a[k] != b[k]} == {"scheme"}


def test_fused_removes_the_row_wise_kernel(h100) -> None:
    """The fused scheme launches no separate row-wise kernel in the forward; tp-nvls does."""
    fused = run_layer(h100, MID.with_run(seq=64), "tp-fused-ar-norm", "prefill")
    base = run_layer(h100, MID.with_run(seq=64), "tp-nvls", "prefill")
    assert fused.total_us < base.total_us


@pytest.mark.parametrize("launch,copies", [("graph", False), ("eager", True), ("fitted", True)])
def test_custom_ar_copies_into_its_buffer_only_out_of_a_cuda_graph(h100, monkeypatch, launch, copies) -> None:
    """vLLM registers a CUDA graph's buffers at capture, so a graph replay runs the
    kernel on the layer's own tensor; out of a graph it copies the input first."""
    from cais.config import apply_overrides
    from cais.schemes.base import LayerRun

    seen: list[int] = []
    orig = LayerRun.production_allreduce

    def spy(self, spec, *a, **kw):
        seen.append(spec.copy_ps)
        return orig(self, spec, *a, **kw)
    monkeypatch.setattr(LayerRun, "production_allreduce", spy)
    cfg = apply_overrides(h100, {"gpu.launch": launch})
    run_layer(cfg, MID.with_run(seq=64), "tp-custom-ar", "prefill")
    assert len(seen) == 2 and all((c > 0) == copies for c in seen)
