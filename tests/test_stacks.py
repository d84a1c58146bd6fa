"""The production stacks' all-reduce choice by size (kernels/stacks.py; issue 58):
each stack's plan equals its own table, read at the commit named beside it, and the
schemes tp-vllm, tp-sglang and tp-trtllm run what the plan says; the launch modes
(gpu.launch) time the host and the gaps as docs/compute-model.md says."""

from __future__ import annotations

import pytest

from cais.experiments.layer import run_layer
from cais.config import load_system
from cais.kernels import stacks as st
from cais.workload.models import ModelSpec

KIB, MIB = 1024, 1 << 20


def labels(plan: st.Plan) -> tuple[str, ...]:
    return plan.labels


# ---- vLLM -------------------------------------------------------------------------------
# vllm-project/vllm vllm/compilation/passes/fusion/allreduce_rms_fusion.py @0052812d:
#   FI_ALLREDUCE_FUSION_MAX_SIZE_MB[90] = {2: 64, 4: 2, 8: 0.5}; one-shot max {2: 32, 4: 2, 8: 0.5}
# vllm/distributed/device_communicators/all_reduce_utils.py @00d618aa:
#   CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"] = {2: 64 MiB, 4: 32 MiB, 6: 512 KiB, 8: 256 KiB} (strictly below),
#   custom max_size 8 MiB; SYMM_MEM_ALL_REDUCE_MAX_SIZES["9.0"] = {2: 64, 4: 32, 6: 64, 8: 64} MiB
# cuda_communicator.py @089eca13: custom, then symmetric memory (multimem on 4, 6, 8), then pynccl
@pytest.mark.parametrize("n, nbytes, launch, want", [
    (8, 8 * KIB, "graph", ("fused-oneshot",)),
    (8, MIB // 2, "graph", ("fused-oneshot",)),
    (8, MIB // 2 + 16, "graph", ("copy", "multimem-twoshot", "copy")),
    (8, 8 * KIB, "eager", ("copy", "custom-oneshot")),  # --enforce-eager: no compile pass, no fusion
    (8, 256 * KIB - 16, "eager", ("copy", "custom-oneshot")),
    (8, 256 * KIB, "eager", ("copy", "multimem-twoshot", "copy")),
    (8, 64 * MIB, "graph", ("copy", "multimem-twoshot", "copy")),
    (8, 64 * MIB + 16, "graph", ("nccl",)),
    (4, 2 * MIB, "graph", ("fused-oneshot",)),
    (4, 2 * MIB + 16, "graph", ("custom-twoshot",)),  # registered in a graph: no copy
    (4, 8 * MIB, "graph", ("copy", "multimem-twoshot", "copy")),  # custom's max_size 8 MiB (below it)
    (2, 48 * MIB, "graph", ("fused-twoshot",)),
    (2, 65 * MIB, "eager", ("nccl",)),  # no multimem at 2 GPUs (PyTorch's P2P two-shot, not modelled)
    (16, 8 * KIB, "graph", ("nccl",)),
])
def test_vllm_plan_is_its_table(n: int, nbytes: int, launch: str, want: tuple[str, ...]) -> None:
    plan = st.vllm_plan(n, nbytes, launch)
    assert labels(plan) == want
    assert plan.fused == want[0].startswith("fused")
    assert all(s.pdl for s in plan.steps if s.kind == "fused")  # FlashInferFusedAllReduceParams.launch_with_pdl


def test_vllm_does_not_fuse_where_the_pattern_does_not_match() -> None:
    assert labels(st.vllm_plan(8, 8 * KIB, "graph", fusable=False)) == ("custom-oneshot",)


# ---- SGLang -------------------------------------------------------------------------------
# sgl-project/sglang python/sglang/srt/distributed/device_communicators/custom_all_reduce_v2.py @08d6c016:
#   THRESHOLD_2_SHOT_MAP (non-sm100) 8: (160 KiB, 160 KiB), 4: (384 KiB, 256 KiB), 2: (2 MiB, inf), inclusive;
#   max_pull_size 16 MiB (should_custom_ar: <= max_size); NCCL above
@pytest.mark.parametrize("n, nbytes, launch, want", [
    (8, 8 * KIB, "graph", ("push-oneshot",)),
    (8, 160 * KIB, "eager", ("push-oneshot",)),
    (8, 160 * KIB + 16, "graph", ("multimem-twoshot",)),
    (8, 160 * KIB + 16, "eager", ("copy", "multimem-twoshot")),
    (8, 16 * MIB, "graph", ("multimem-twoshot",)),
    (8, 16 * MIB + 16, "graph", ("nccl",)),
    (4, 384 * KIB, "graph", ("push-oneshot",)),
    (4, 384 * KIB + 16, "graph", ("multimem-twoshot",)),
    (2, 4 * MIB, "graph", ("custom-oneshot",)),  # one-shot pull (inf threshold at 2)
    (16, 8 * KIB, "graph", ("nccl",)),
])
def test_sglang_plan_is_its_table(n: int, nbytes: int, launch: str, want: tuple[str, ...]) -> None:
    plan = st.sglang_plan(n, nbytes, launch)
    assert labels(plan) == want and not plan.fused
    assert all(s.pdl for s in plan.steps if s.kind not in ("nccl", "copy"))


# ---- TensorRT-LLM -------------------------------------------------------------------------
# NVIDIA/TensorRT-LLM cpp/tensorrt_llm/common/customAllReduceUtils.h @005b299b:
#   AllReduceBestStrategyTableSM90, TP=8, RESIDUAL_RMS_NORM, hidden 4096: {4 x7, 0 ...}; hidden 8192: {4 x6, 0 ...};
#   TP=2 hidden 4096: {4, 4, 4, 4, 5, 4, ...}; getMaxRequiredWorkspaceSize: 16e6 at <= 2 GPUs, 8e6 above
@pytest.mark.parametrize("n, tokens, hidden, want", [
    (8, 1, 4096, ("fused-oneshot",)),
    (8, 64, 4096, ("fused-oneshot",)),
    (8, 127, 4096, ("fused-oneshot",)),  # floor(log2(127)) = 6
    (8, 128, 4096, ("nccl",)),
    (8, 32, 8192, ("fused-oneshot",)),
    (8, 64, 8192, ("nccl",)),
    (8, 1024, 4096, ("nccl",)),
    (8, 512, 1024, ("fused-twoshot",)),  # hidden 1024 row: {4 x9, 5, 5, 5, 0 ...}
    (2, 16, 4096, ("fused-twoshot",)),
    (2, 4096, 4096, ("nccl",)),  # 32 MB > the 16 MB workspace
    (8, 1 << 15, 128, ("nccl",)),  # out of the table
])
def test_trtllm_plan_is_its_table(n: int, tokens: int, hidden: int, want: tuple[str, ...]) -> None:
    plan = st.trtllm_plan(n, tokens, hidden)
    assert labels(plan) == want
    assert plan.fused == (want[0] != "nccl")


# ---- the schemes run their plan -----------------------------------------------------------
SMALL = ModelSpec(name="mid", family="llama", hidden=1024, ffn_hidden=2048, heads=8, kv_heads=8, layers=2,
                  gated_mlp=True, norm="rmsnorm", activation="swiglu", seq=128, batch=1)


@pytest.fixture(scope="module")
def h100():
    return load_system("dgx-h100")


def _cfg(h100, launch: str, **gpu: object):
    return h100.with_overrides(gpu={**h100.gpu.model_dump(), "launch": launch, **gpu})


@pytest.mark.parametrize("scheme, launch, ran", [
    ("tp-vllm", "graph", "fused-oneshot/simple"),  # 8 tokens x 1024 x 2 B = 16 KiB: fused
    ("tp-vllm", "eager", "custom-oneshot/simple"),
    ("tp-sglang", "graph", "push-oneshot/simple"),
    ("tp-trtllm", "eager", "fused-oneshot/simple"),
])
def test_each_stack_runs_its_plan_in_decode(h100, scheme: str, launch: str, ran: str) -> None:
    r = run_layer(_cfg(h100, launch), SMALL.with_run(batch=8, seq=256), scheme, "decode")
    assert r.collectives_ran == {ran: 2}


def test_vllm_eager_copies_into_the_registered_buffer_as_a_kernel(h100) -> None:
    """Eager: the copy is a kernel of its own before the custom all-reduce; a graph
    registers the input (and fuses the norm), so the eager period is the longer."""
    eager = run_layer(_cfg(h100, "eager"), SMALL.with_run(batch=8, seq=256), "tp-vllm", "decode")
    graph = run_layer(_cfg(h100, "graph"), SMALL.with_run(batch=8, seq=256), "tp-vllm", "decode")
    assert eager.total_us > graph.total_us


@pytest.mark.parametrize("scheme", ["tp-vllm", "tp-sglang", "tp-trtllm"])
@pytest.mark.parametrize("launch", ["eager", "graph"])
def test_stacks_sum_exactly_in_functional_mode(h100, scheme: str, launch: str) -> None:
    cfg = _cfg(h100, launch).with_overrides(gpus=4)
    r = run_layer(cfg, SMALL.with_run(batch=4, seq=64), scheme, "decode", functional=True, seed=2)
    assert r.checked > 0 and r.mismatches == []


def test_prefill_runs_the_large_size_kernels(h100) -> None:
    """1024 tokens x 1024 x 2 B = 2 MiB at 8 GPUs: vLLM multimem (with copies), SGLang
    its NVLS two-shot, TensorRT-LLM its fused two-shot (TP 8, hidden 1024 row: 5 at 1024 tokens)."""
    model = SMALL.with_run(batch=1, seq=1024)
    got = {s: run_layer(_cfg(h100, "eager"), model, s, "prefill").collectives_ran
           for s in ("tp-vllm", "tp-sglang", "tp-trtllm")}
    assert got["tp-vllm"] == {"multimem-twoshot/simple": 2}
    assert got["tp-sglang"] == {"multimem-twoshot/simple": 2}
    assert got["tp-trtllm"] == {"fused-twoshot/simple": 2}


# ---- launch modes ---------------------------------------------------------------------------
def test_fitted_is_the_default_and_unchanged(h100) -> None:
    assert h100.gpu.launch == "fitted"
    a = run_layer(h100, SMALL.with_run(batch=8, seq=256), "tp-nccl", "decode")
    b = run_layer(_cfg(h100, "fitted", kernel_gap_us=9.0, host_op_us=99.0), SMALL.with_run(batch=8, seq=256),
                  "tp-nccl", "decode")
    assert a.total_us == b.total_us


def test_graph_gaps_replace_the_fitted_overheads(h100) -> None:
    model = SMALL.with_run(batch=8, seq=256)
    g1 = run_layer(_cfg(h100, "graph", kernel_gap_us=1.0), model, "tp-nccl", "decode").total_us
    g2 = run_layer(_cfg(h100, "graph", kernel_gap_us=2.0), model, "tp-nccl", "decode").total_us
    fitted = run_layer(h100, model, "tp-nccl", "decode").total_us
    assert g1 < g2 < fitted
    # host cost does not exist in a graph replay
    assert run_layer(_cfg(h100, "graph", kernel_gap_us=1.0, host_op_us=50.0), model, "tp-nccl",
                     "decode").total_us == g1


def test_eager_is_host_bound_when_the_host_is_slow(h100) -> None:
    """With 50 us per op the host, not the GPU, sets the period: at least one op's
    issue time per kernel the period launches."""
    model = SMALL.with_run(batch=8, seq=256)
    slow = run_layer(_cfg(h100, "eager", host_op_us=50.0), model, "tp-nccl", "decode")
    fast = run_layer(_cfg(h100, "eager", host_op_us=0.0), model, "tp-nccl", "decode")
    assert slow.total_us > 50.0 * 8 > fast.total_us


def test_pdl_gap_applies_to_pdl_launches_only(h100) -> None:
    model = SMALL.with_run(batch=8, seq=256)
    base = run_layer(_cfg(h100, "graph"), model, "tp-vllm", "decode").total_us
    less = run_layer(_cfg(h100, "graph", pdl_gap_us=0.0), model, "tp-vllm", "decode").total_us
    nccl = [run_layer(_cfg(h100, "graph", pdl_gap_us=p), model, "tp-nccl", "decode").total_us for p in (0.0, 0.5)]
    assert abs(base - less - 2 * 0.5) < 0.05  # two fused all-reduces launched with PDL
    assert nccl[0] == nccl[1]


# ---- the plan notation and the back-to-back op loop (experiments/stack_op.py) ----------
def test_plan_notation_parses_kernels_paths_pdl_and_the_fused_norm() -> None:
    p = st.parse_plan("copy+multimem-twoshot+copy", 8, MIB)
    assert p.labels == ("copy", "multimem-twoshot", "copy") and not p.fused
    f = st.parse_plan("fused-oneshot@pdl+norm", 2, 72 * KIB)
    assert f.fused and f.steps == (st.Step("fused", "oneshot", pdl=True),)
    # a custom step without a path takes vLLM's choice by size
    assert st.parse_plan("custom", 8, 8 * KIB).labels == ("custom-oneshot",)
    assert st.parse_plan("custom", 8, 4 * MIB).labels == ("custom-twoshot",)
    for bad in ("warp-oneshot", "custom-threeshot", "custom@fast", "norm", "copy+norm"):
        with pytest.raises(ValueError, match="plan"):
            st.parse_plan(bad, 8, MIB)


def test_op_loop_is_host_bound_eager_and_gap_bound_in_a_graph() -> None:
    """Back-to-back calls of a tiny all-reduce: eager, the host's issue (an op and a
    further launch) spaces them; in a graph the kernels and their gaps do."""
    from cais.config import apply_overrides
    from cais.experiments.stack_op import op_loop

    cfg = load_system("dgx-h100")
    g = cfg.gpu
    eager = op_loop(apply_overrides(cfg, {"gpu.launch": "eager"}), st.parse_plan("copy+custom-oneshot", 8, 2 * KIB),
                    2 * KIB, 2)
    assert len(eager.ends_us) == 6 and eager.ends_us == tuple(sorted(eager.ends_us))
    assert eager.per_call_us == pytest.approx(g.host_op_us + g.host_launch_us, abs=1e-3)
    graph = op_loop(apply_overrides(cfg, {"gpu.launch": "graph"}), st.parse_plan("custom-oneshot", 8, 2 * KIB),
                    2 * KIB, 2)
    assert g.kernel_gap_us < graph.per_call_us < eager.per_call_us
    slower = op_loop(apply_overrides(cfg, {"gpu.launch": "graph", "gpu.kernel_gap_us": str(g.kernel_gap_us + 1)}),
                     st.parse_plan("custom-oneshot", 8, 2 * KIB), 2 * KIB, 2)
    assert slower.per_call_us == pytest.approx(graph.per_call_us + 1, abs=0.01)
