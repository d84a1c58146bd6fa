"""Which all-reduce kernels each production inference stack runs for a TP all-reduce
followed by residual add + RMSNorm, by size, GPU count and launch mode: the stacks'
own tables, read (not copied) from their sources at the commits named here. A
stack's choice is a :class:`Plan`: the kernels of the op in order (copies into and
out of registered buffers are kernels of their own), whether the norm is fused, and
which launches use programmatic dependent launch (PDL). The schemes that run them:
``schemes/tp_stacks.py``; the page: docs/schemes/tp-stacks.md.

Hopper (sm90) tables only: the presets the production experiment runs are H100/H200
(nvl72's GB200 would take the sm100 rows, not modelled: its points run the sm90
rows, said in the scheme page).

**vLLM** (``tp-vllm``; torch symmetric memory on, ``VLLM_ALLREDUCE_USE_SYMM_MEM``):

* fused all-reduce + RMSNorm (FlashInfer's ``trtllm_allreduce_fusion``, launched
  with PDL): vllm-project/vllm ``vllm/compilation/passes/fusion/allreduce_rms_fusion.py``
  @0052812d, ``FI_ALLREDUCE_FUSION_MAX_SIZE_MB`` sm90 {2: 64, 4: 2, 8: 0.5} MB (the
  issue's 0.5 MB at 8 GPUs confirmed), one-shot up to
  ``_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB`` sm90 {2: 32, 4: 2, 8: 0.5}, world sizes
  {2, 4, 8}, ``launch_with_pdl = True``. A torch.compile pass: it runs only when vLLM
  compiles the model, which ``--enforce-eager`` (our ``eager`` launch mode for
  decode) turns off; a prefill above the CUDA-graph capture sizes is compiled but not
  graphed, so it keeps the pass (our prefill runs eager launches, compiled).
* custom all-reduce below ``CUSTOM_ALL_REDUCE_MAX_SIZES`` sm90 {2: 64 MiB, 4: 32 MiB,
  6: 512 KiB, 8: 256 KiB} (strictly below: ``should_custom_ar``), capped by
  ``max_size`` 8 MiB: ``vllm/distributed/device_communicators/all_reduce_utils.py``
  @00d618aa, ``custom_all_reduce.py``; eager copies the input into the registered
  buffer (a copy of its own), a graph registers it.
* then the symmetric-memory multimem all-reduce up to ``SYMM_MEM_ALL_REDUCE_MAX_SIZES``
  sm90 {2: 64, 4: 32, 6: 64, 8: 64} MiB for world sizes {4, 6, 8}
  (``symm_mem.py``): three kernels, copy into the symmetric buffer,
  ``multimem_all_reduce_``, copy out; then NCCL. The order (custom, then symmetric
  memory, then pynccl): ``cuda_communicator.py`` ``all_reduce`` @089eca13.

**SGLang** (``tp-sglang``; ``SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2`` defaults to true
in the stored ``python/sglang/srt/environ.py`` @21ff4b08): its second custom
all-reduce, ``python/sglang/srt/distributed/device_communicators/custom_all_reduce_v2.py``
@08d6c016, ``THRESHOLD_2_SHOT_MAP`` (non-sm100, tuned on H200) {2: (2 MiB, inf),
3: (512 KiB, 512 KiB), 4: (384 KiB, 256 KiB), 5: (256, 256), 6: (192, 192),
7: (192, 192), 8: (160 KiB, 160 KiB)} as (one-shot push, one-shot pull)
thresholds, inclusive; above both a two-shot pull; cap 16 MiB (the pull buffer,
``SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB``), NCCL above. One-shot push: every GPU
stores its input into every peer's push buffer, each reduces locally (the Lamport
one-shot's data movement, without the norm). The two-shot pull runs on NVLS
multicast where the buffer has a multicast address (later versions' pull kernels
require it): modelled as the multimem two-shot. Eager copies the input into the pull
buffer; a graph registers it. The kernels launch with PDL. The norm is a kernel of
its own (SGLang's FlashInfer fusion is off by default).

**TensorRT-LLM** (``tp-trtllm``; ``AllReduceStrategy.AUTO``, fusion
RESIDUAL_RMS_NORM): NVIDIA/TensorRT-LLM ``cpp/tensorrt_llm/common/customAllReduceUtils.h``
@005b299b, ``AllReduceBestStrategyTableSM90`` indexed [log2(tp) - 1][fusion op]
[log2(hidden) - 7][floor(log2(tokens))]: 4 = ONESHOT, 5 = TWOSHOT, 0 = NCCL; out of
the table, NCCL. At TP 8 with the fusion, hidden 4096: one-shot for 1-64 tokens,
NCCL from 128; hidden 8192: one-shot for 1-32, NCCL from 64 (the issue's 64/32
confirmed). The fused kernels' workspace: ``getMaxRequiredWorkspaceSize`` 8 MB
(8e6 bytes) above 2 GPUs, 16 MB at 2; a larger message runs NCCL. The one-shot
clears the Lamport buffer of an earlier call; the two-shot copies its input into
its own buffer first (``allReduceFusionKernels.cu`` @04c74656). PDL: not modelled
for TensorRT-LLM (it depends on ``TRTLLM_ENABLE_PDL``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import log2

KIB, MIB = 1024, 1 << 20
INF = 1 << 62

# ---- vLLM ---------------------------------------------------------------------------
VLLM_FUSION_MAX_SM90 = {2: 64 * MIB, 4: 2 * MIB, 8: MIB // 2}
VLLM_FUSION_ONESHOT_MAX_SM90 = {2: 32 * MIB, 4: 2 * MIB, 8: MIB // 2}
VLLM_CUSTOM_MAX_SM90 = {2: 64 * MIB, 4: 32 * MIB, 6: MIB // 2, 8: MIB // 4}
VLLM_CUSTOM_MAX_SIZE = 8 * MIB
VLLM_SYMM_MEM_MAX_SM90 = {2: 64 * MIB, 4: 32 * MIB, 6: 64 * MIB, 8: 64 * MIB}
VLLM_MULTIMEM_WORLD_SIZES_SM90 = (4, 6, 8)

# ---- SGLang custom all-reduce v2 -------------------------------------------------------
SGLANG_THRESHOLDS_SM90 = {2: (2 * MIB, INF), 3: (512 * KIB, 512 * KIB), 4: (384 * KIB, 256 * KIB),
                          5: (256 * KIB, 256 * KIB), 6: (192 * KIB, 192 * KIB), 7: (192 * KIB, 192 * KIB),
                          8: (160 * KIB, 160 * KIB)}
SGLANG_MAX_SIZE = 16 * MIB

# ---- TensorRT-LLM AUTO -----------------------------------------------------------------
TRTLLM_ONESHOT, TRTLLM_TWOSHOT, TRTLLM_NCCL = 4, 5, 0
#: AllReduceBestStrategyTableSM90[tp][RESIDUAL_RMS_NORM][hidden 128..8192][tokens 1..16384]
TRTLLM_TABLE_SM90_RMSNORM = {
    2: [[4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0],
        [4, 4, 4, 4, 5, 5, 5, 5, 4, 4, 4, 4, 0, 0, 0], [4, 4, 4, 4, 4, 5, 5, 4, 5, 4, 4, 4, 0, 0, 0],
        [4, 4, 4, 5, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0], [4, 4, 4, 4, 5, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0],
        [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0]],
    4: [[4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0],
        [4, 4, 4, 4, 4, 4, 5, 4, 4, 4, 4, 5, 0, 0, 0], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 0, 0, 0],
        [4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 0, 0, 0, 0], [4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 0, 0, 0, 0, 0],
        [4, 4, 4, 4, 4, 4, 4, 4, 5, 0, 0, 0, 0, 0, 0]],
    8: [[4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 0, 0, 0, 0],
        [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 0, 0, 0], [4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 0, 0, 0],
        [4, 4, 4, 4, 4, 4, 4, 4, 0, 5, 5, 0, 0, 0, 0], [4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0],
        [4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0]],
}


def trtllm_workspace_bytes(n: int) -> int:
    """``getMaxRequiredWorkspaceSize``: 16 MB at 2 GPUs, 8 MB above (decimal)."""
    return 16_000_000 if n <= 2 else 8_000_000


@dataclass(frozen=True)
class Step:
    """One kernel of a stack's all-reduce op: ``kind`` is ``copy`` (a device copy of
    the buffer), ``custom``, ``multimem``, ``fused`` (the production kernels,
    kernels/production_ar.py), ``push`` (SGLang's one-shot push: the fused family's
    one-shot without the norm) or ``nccl`` (NCCL's own choice, tp-nccl's run);
    ``path`` one-shot or two-shot; ``pdl``: launched with PDL."""

    kind: str
    path: str = ""
    pdl: bool = False

    @property
    def label(self) -> str:
        return f"{self.kind}-{self.path}" if self.path else self.kind


@dataclass(frozen=True)
class Plan:
    """A stack's all-reduce of one size: its kernels in order and whether the
    residual add + RMSNorm runs inside the all-reduce kernel (``fused``)."""

    steps: tuple[Step, ...]
    fused: bool = False
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(s.label for s in self.steps)


NCCL = Plan((Step("nccl"),))

STEP_KINDS = ("copy", "custom", "multimem", "fused", "push", "nccl")


def parse_plan(text: str, n: int, nbytes: int) -> Plan:
    """A plan from its notation: kernels in order joined by ``+``, each
    ``kind[-path][@pdl]``, and a last ``norm`` where the residual add + RMSNorm is
    fused into the fused kernel before it; e.g. ``copy+custom-twoshot``,
    ``copy+multimem-twoshot+copy``, ``fused-oneshot@pdl+norm``. A ``custom`` step
    without a path takes vLLM's choice by size (``custom_path``)."""
    from cais.kernels.production_ar import PATHS, custom_path

    parts = [p.strip() for p in text.split("+") if p.strip()]
    fused = bool(parts) and parts[-1] == "norm"
    if fused:
        parts = parts[:-1]
    steps = []
    for part in parts:
        body, _, flag = part.partition("@")
        kind, _, path = body.partition("-")
        if kind not in STEP_KINDS or (path and path not in PATHS) or flag not in ("", "pdl"):
            raise ValueError(f"plan '{text}': step '{part}' is not kind[-path][@pdl] with kind one of "
                             f"{', '.join(STEP_KINDS)} and path one of {', '.join(PATHS)}")
        if kind == "custom" and not path:
            path = custom_path(n, nbytes)
        steps.append(Step(kind, path, pdl=flag == "pdl"))
    if not steps or (fused and steps[-1].kind != "fused"):
        raise ValueError(f"plan '{text}': no kernels, or 'norm' not after a fused kernel")
    return Plan(tuple(steps), fused=fused)


def vllm_plan(n: int, nbytes: int, launch: str, fusable: bool = True) -> Plan:
    """vLLM's all-reduce (+ norm) of ``nbytes`` on ``n`` sm90 GPUs. ``launch``:
    eager (``--enforce-eager``: no compile, so no fusion pass) or graph/compiled;
    ``fusable``: the all-reduce feeds a residual add + RMSNorm (the pass's pattern)."""
    compiled = launch != "eager"
    if compiled and fusable and n in VLLM_FUSION_MAX_SM90 and nbytes <= VLLM_FUSION_MAX_SM90[n]:
        path = "oneshot" if nbytes <= VLLM_FUSION_ONESHOT_MAX_SM90[n] else "twoshot"
        return Plan((Step("fused", path, pdl=True),), fused=True)
    custom_max = min(VLLM_CUSTOM_MAX_SIZE, VLLM_CUSTOM_MAX_SM90.get(n, VLLM_CUSTOM_MAX_SIZE))
    if n in (2, 4, 6, 8) and nbytes % 16 == 0 and nbytes < custom_max:
        from cais.kernels.production_ar import custom_path

        ar = Step("custom", custom_path(n, nbytes))
        return Plan((ar,) if launch == "graph" else (Step("copy"), ar))
    if n in VLLM_MULTIMEM_WORLD_SIZES_SM90 and nbytes % 4 == 0 and nbytes <= VLLM_SYMM_MEM_MAX_SM90[n]:
        return Plan((Step("copy"), Step("multimem", "twoshot"), Step("copy")))
    return NCCL


def sglang_plan(n: int, nbytes: int, launch: str) -> Plan:
    """SGLang's custom all-reduce v2 of ``nbytes`` on ``n`` sm90 GPUs (NCCL above
    its cap or on an unsupported world size); the norm is its own kernel."""
    if n not in SGLANG_THRESHOLDS_SM90 or nbytes % 16 or nbytes > SGLANG_MAX_SIZE:
        return NCCL
    push, pull = SGLANG_THRESHOLDS_SM90[n]
    push, pull = min(push, SGLANG_MAX_SIZE), min(pull, SGLANG_MAX_SIZE)
    if nbytes <= push:
        return Plan((Step("push", "oneshot", pdl=True),))
    # a one-shot pull (n = 2..4 on sm90) is the custom one-shot's data movement
    ar = Step("custom", "oneshot", pdl=True) if nbytes <= pull else Step("multimem", "twoshot", pdl=True)
    return Plan((ar,) if launch == "graph" else (Step("copy"), ar))


def trtllm_strategy(n: int, tokens: int, hidden: int) -> int:
    """``selectStrategyLookUpTable`` with RESIDUAL_RMS_NORM on sm90: 4 one-shot, 5
    two-shot, 0 NCCL (out of the table: NCCL)."""
    table = TRTLLM_TABLE_SM90_RMSNORM.get(n)
    if table is None or tokens < 1 or hidden < 128:
        return TRTLLM_NCCL
    h, t = int(log2(hidden)) - 7, int(log2(tokens))
    if h >= len(table) or t >= len(table[h]):
        return TRTLLM_NCCL
    return table[h][t]


def trtllm_plan(n: int, tokens: int, hidden: int, elem_bytes: int = 2, fusable: bool = True) -> Plan:
    """TensorRT-LLM's AUTO all-reduce with the residual + RMSNorm fusion: the fused
    kernel by the SM90 table, NCCL (and a separate norm kernel) where the table
    says so or the message exceeds the workspace."""
    if not fusable or tokens * hidden * elem_bytes > trtllm_workspace_bytes(n):
        return NCCL
    s = trtllm_strategy(n, tokens, hidden)
    if s == TRTLLM_ONESHOT:
        return Plan((Step("fused", "oneshot"),), fused=True)
    if s == TRTLLM_TWOSHOT:
        return Plan((Step("fused", "twoshot"),), fused=True)
    return NCCL
