"""Per-GPU HBM footprint of a run: what one GPU of the tensor-parallel group must hold
for the whole model, not only the one layer period the simulator runs.

Counted (docs/memory.md gives the formulas and sources):

* **weights** of every layer (Q, K, V, output projection, MLP; no norms, no biases)
  plus the input embedding and the output layer (``vocab x hidden`` each, untied),
  sharded by TP as Megatron shards them; a KV head is replicated where ``kv_heads``
  is fewer than the GPUs, so each GPU holds at least one (``dims_for``);
* **KV cache** (prefill and decode): ``layers x 2 x kv_heads per GPU x head_dim x
  bytes x batch x seq``;
* **activations**: the peak of the simulated period's own tensors in program order
  (one layer's working set), plus, in train, the activations the other
  ``layers - 1`` layers keep for the backward pass (Korthikanti et al. 2022);
* **gradients** and **optimizer** state in train: mixed-precision Adam, 2 B of
  gradient and 12 B of fp32 master weight, m and v per parameter on top of the 2 B
  weight (16 B per parameter; Rajbhandari et al. 2020, ZeRO §3.1), sharded by TP only:
  the simulated group has no data parallelism to shard them further.

Not counted: the CUDA context, allocator fragmentation, NCCL buffers, workspaces.
"""

from __future__ import annotations

from dataclasses import dataclass

from cais.errors import UserError
from cais.workload.dataflow import LayerGraph, build_graph
from cais.workload.dims import Dims
from cais.workload.models import ModelSpec

GB = 1e9
MASK_BYTES = 1  # a dropout mask element (Korthikanti et al. 2022 store masks as bytes)
FP32_BYTES = 4
ADAM_STATES = 2  # Adam's first and second moments, fp32 each


class MemoryCapacityError(UserError):
    """A run whose per-GPU footprint exceeds the GPU's HBM; its message is one line."""


@dataclass(frozen=True)
class Footprint:
    """Bytes one GPU holds for a run of ``model`` in ``mode`` at TP ``gpus``, by part."""

    model: str
    mode: str
    gpus: int
    weights: int
    kv_cache: int
    activations: int
    gradients: int = 0
    optimizer: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations + self.gradients + self.optimizer

    @property
    def parts(self) -> dict[str, int]:
        """Part name (as the error message and docs/memory.md say it) -> bytes."""
        return {"weights": self.weights, "KV cache": self.kv_cache, "activations": self.activations,
                "gradients": self.gradients, "optimizer": self.optimizer}

    def as_json(self) -> dict[str, float]:
        """Every part and the total in GB (1e9 bytes)."""
        keys = ("weights", "kv_cache", "activations", "gradients", "optimizer")
        out = {f"{k}_GB": getattr(self, k) / GB for k in keys}
        out["total_GB"] = self.total / GB
        return out

    def describe(self) -> str:
        """The parts that are not zero, in GB: ``weights 17.6, KV cache 41.0, activations 0.0 GB``."""
        parts = ", ".join(f"{name} {b / GB:,.1f}" for name, b in self.parts.items()
                          if b or name in ("weights", "activations"))
        return f"{parts} GB"


def weight_params(model: ModelSpec, d: Dims) -> int:
    """Parameters one GPU holds: every layer's Q, K, V, output-projection and MLP shard
    (a replicated KV head counts on every GPU holding it) and its share of the input
    embedding and the output layer (vocab-parallel, untied)."""
    h = model.hidden
    layer = h * (d.q_l + 2 * d.kv_l * d.head_dim) + d.q_l * h + (3 if d.gated else 2) * h * d.ffn_l
    vocab = 2 * -(-model.vocab // d.n) * h if model.vocab else 0
    return model.layers * layer + vocab


def kv_cache_bytes(model: ModelSpec, d: Dims) -> int:
    """The KV cache of every layer on one GPU: K and V of its KV heads for ``batch``
    sequences of ``kv_len`` tokens."""
    return model.layers * 2 * d.kv_l * d.head_dim * model.dtype_bytes * d.batch * d.kv_len


def stored_activation_bytes(model: ModelSpec, d: Dims, keep_inputs: bool = False) -> int:
    """Activations one layer keeps for its backward pass on one GPU: Korthikanti et al.
    2022, Table 2, with selective recomputation (FlashAttention keeps no s x s scores,
    so the ``5as/(ht)`` term is gone), generalised to GQA and gated MLPs. Per token row:
    both LayerNorm inputs, both GEMM inputs after them and two dropout masks
    (``10h`` bytes at 2 B; sharded by TP with sequence parallelism, else on every GPU),
    and Q, K, V, the attention output, the FC1 output and the activation output
    (``24h/t`` for a GPT layer), sharded by TP. GPT, no SP: ``sbh(10 + 24/t)``;
    with SP: ``sbh * 34/t``. ``keep_inputs``: the two GEMM inputs after the norms are
    kept gathered (``4h`` bytes per token row on every GPU) instead of sharded."""
    b, h = model.dtype_bytes, model.hidden
    per_row = 4 * h * b + 2 * h * MASK_BYTES
    sharded = (2 * d.q_l + 2 * d.kv_l * d.head_dim + d.fc1_l + d.ffn_l) * b
    gathered = 2 * h * b * (d.tokens - d.rows_l) if keep_inputs and d.sp else 0
    return d.rows_l * per_row + d.tokens * sharded + gathered


def weight_tensors(g: LayerGraph) -> set[str]:
    """The period's weights (B operand of a forward or dgrad GEMM) and weight gradients
    (C of a wgrad GEMM)."""
    out: set[str] = set()
    for op in g.ops:
        if op.operands is not None:
            out.add(op.operands.c if op.role == "wgrad" else op.operands.b)
    return out


def live_activation_bytes(g: LayerGraph, dtype_bytes: int, weights: frozenset[str] = frozenset()) -> int:
    """The peak, over the period's ops in program order, of the activation tensors one
    GPU holds (weights, weight gradients and the KV cache left out): a tensor is live
    from its first write (the period's start for an input) to its last read (the end
    for an output). ``weights``: further tensors that are weights or weight gradients
    (operands of steps that are not GEMM ops, such as a MoE layer's grouped GEMMs)."""
    skip = weight_tensors(g) | weights
    last = len(g.ops) - 1
    spans: list[tuple[int, int, int]] = []
    for name, t in g.tensors.items():
        if name in skip or t.sharding == "heads":
            continue
        writes = [i for i, op in enumerate(g.ops) if name in op.writes]
        reads = [i for i, op in enumerate(g.ops) if name in op.reads]
        if not writes and not reads:
            continue
        start = min(writes) if writes else 0
        end = max(reads) if reads and max(reads) >= max(writes, default=0) else last
        rows, cols = t.local
        spans.append((start, end, rows * cols * dtype_bytes))
    return max((sum(b for s, e, b in spans if s <= i <= e) for i in range(len(g.ops))), default=0)


def footprint(model: ModelSpec, gpus: int, mode: str, sp: bool, keep_inputs: bool = False) -> Footprint:
    """The per-GPU footprint of ``model`` in ``mode`` (train, prefill, decode) over
    ``gpus`` TP ranks; ``sp``: the scheme shards activations by sequence (its stored
    activations are then sharded too); ``keep_inputs``: with SP, every layer keeps the
    gathered inputs of its column-parallel GEMMs for the backward
    (``train.wgrad_inputs`` = keep) instead of their shards. A model that does not
    split raises ModelError."""
    g = build_graph(model, gpus, mode, sp)
    d, b = g.dims, model.dtype_bytes
    params = weight_params(model, d)
    kv = kv_cache_bytes(model, d) if mode in ("prefill", "decode") else 0
    act = live_activation_bytes(g, b)
    grads = optim = 0
    if mode == "train":
        act += (model.layers - 1) * stored_activation_bytes(model, d, keep_inputs)
        grads = params * b
        master = FP32_BYTES if b < FP32_BYTES else 0  # mixed precision keeps an fp32 copy
        optim = params * (ADAM_STATES * FP32_BYTES + master)
    return Footprint(model.name, mode, gpus, params * b, kv, act, grads, optim)


def over_capacity(fp: Footprint, capacity_GB: float, gpu: str, shape: str = "", split: str = "") -> str | None:
    """One line saying that ``fp`` needs more than ``capacity_GB`` per GPU (its parts,
    the GPU ``gpu``, the run ``shape`` such as ``batch 1 and seq 10,000,000``, the
    ``split`` over the GPUs (default ``TP <gpus>``) and what to change, naming
    ``gpu.hbm_capacity_GB``); None where it fits."""
    if fp.total <= capacity_GB * GB:
        return None
    state = fp.weights + fp.gradients + fp.optimizer
    advice = "use more GPUs" if state > capacity_GB * GB else "reduce seq or batch, use more GPUs"
    at = f" with {shape}" if shape else ""
    return (f"memory: {fp.model} {fp.mode}{at} needs {fp.total / GB:,.1f} GB per GPU ({fp.describe()}) at "
            f"{split or f'TP {fp.gpus}'}, beyond the {capacity_GB:,g} GB of HBM of one {gpu}; {advice}, or set "
            "gpu.hbm_capacity_GB")


def check_fits(fp: Footprint, capacity_GB: float, gpu: str, shape: str = "") -> None:
    """MemoryCapacityError (one line, naming the parts and ``gpu.hbm_capacity_GB``) if
    ``fp`` needs more than ``capacity_GB`` per GPU; ``gpu`` names the GPU and
    ``shape`` the run shape (``batch 1 and seq 10,000,000``) in the message."""
    line = over_capacity(fp, capacity_GB, gpu, shape)
    if line is not None:
        raise MemoryCapacityError(line)
