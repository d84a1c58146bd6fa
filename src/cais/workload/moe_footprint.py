"""Per-GPU HBM footprint of a mixture-of-experts (MoE) run: what one GPU must hold for
the whole MoE model when its experts are split over the GPUs by expert parallelism
(EP over ``gpus / expert_tp`` ranks, each expert ``expert_tp`` ways) and its attention
runs under TP over every GPU (``attention="tp"``) or data parallel (``"dp"``), as the
layer path runs it (cais.workload.moe_dataflow). The dense footprint's conventions
(cais.workload.footprint, docs/memory.md "MoE runs"):

* **weights**: attention of every layer under its TP (MLA's real projections where the
  model has MLA: its down-projections replicated, its up- and output projections split
  by heads, as SGLang and Megatron-Core shard them; the simulated layer times MLA as MHA
  but the footprint counts MLA); each GPU's ``experts / ep`` routed experts, its
  ``1 / expert_tp`` share of each; the shared experts and the router whole on every GPU
  (the layer path runs the shared experts on each GPU's own rows); the dense first
  layers' MLP under TP over every GPU (as their decode period runs,
  cais.experiments.layer ``dense_first_us``); the input embedding and output layer,
  untied and split over the attention's TP group. Linear layers in
  ``weight_dtype_bytes`` in inference (DeepSeek-V3: FP8 as released; its block scales,
  4 B per 128 x 128, are left out: 0.02 %), the embeddings and the router in
  ``dtype_bytes``; training holds every weight in ``dtype_bytes`` (the FP8 release is
  an inference checkpoint);
* **KV cache** (prefill and decode) of every layer: MLA's compressed latent
  (``kv_lora_rank + qk_rope_head_dim`` values per token and layer, the same on every
  attention-TP rank: the latent is shared by the heads), else K and V of the GPU's KV
  heads;
* **activations**: the peak of the simulated period's own tensors in program order,
  the experts' receive-side tensors (the dispatch's and combine's received rows, the
  expert GEMMs' rows) scaled from the mean to the busiest GPU of the routing; in train
  also what each other layer keeps for its backward: for a MoE layer, the period's
  tensors its backward reads (from the dataflow), for a dense first layer Korthikanti et
  al.'s count (cais.workload.footprint ``stored_activation_bytes``);
* **gradients** and **optimizer** state in train: mixed-precision Adam per parameter
  the GPU holds (no data-parallel sharding).

Not counted, beyond the dense list: DeepEP's and NCCL's communication buffers (fixed
allocations of the library, not the model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from cais.workload.dataflow import LayerGraph, Tensor
from cais.workload.dims import Dims, dims_for
from cais.workload.footprint import (ADAM_STATES, FP32_BYTES, Footprint, kv_cache_bytes, live_activation_bytes,
                                     stored_activation_bytes, weight_tensors)
from cais.workload.moe import MoeSpec
from cais.workload.moe_dataflow import (attention_group, attention_model, build_moe_graph, dense_layer_model,
                                        dense_tp_group, ep_plan, moe_dims)

#: the expert block's weight tensors and weight gradients (grouped-GEMM steps' operands)
EXPERT_WEIGHTS = frozenset({"we1", "we2", "dwe1", "dwe2"})
#: MLA's latent cache in its own graph (``moe.mla_timing=mla``): the KV cache, counted as such
LATENT_CACHE = frozenset({"ckv_cache"})
#: the tensors whose rows are the rows a GPU's experts received (forward and backward)
RECEIVED = ("recv", "recv_g", "ef", "eg", "eo", "eo_r", "deo", "deo_r", "deg", "def", "drecv", "drecv_r")
#: weight parts in the order docs/memory.md lists them
WEIGHT_PARTS = ("attention", "experts", "shared", "router", "dense_mlp", "embeddings")


@dataclass(frozen=True)
class MoeFootprint(Footprint):
    """A MoE run's per-GPU footprint (:class:`~cais.workload.footprint.Footprint`'s
    parts, reported as the dense path reports them) with its weights by part in bytes
    (``weight_parts``: :data:`WEIGHT_PARTS`) and the split it was counted for."""

    weight_parts: dict[str, int] = field(default_factory=dict)
    split: str = ""


def mla_attention_params(moe: MoeSpec, t: int) -> int:
    """One layer's MLA weights on one GPU of an attention TP group of ``t``: the query's
    down-projection (``hidden x q_lora_rank``) and the KV latent's with the shared RoPE
    key (``hidden x (kv_lora_rank + qk_rope_head_dim)``) whole on every GPU, the query's
    up-projection (``q_lora_rank`` (or ``hidden``) ``x heads (nope + rope)``), the KV
    up-projection (``kv_lora_rank x heads (nope + v_head_dim)``) and the output
    projection (``heads v_head_dim x hidden``) split by heads (DeepSeek-V3's modules
    ``q_a_proj``, ``kv_a_proj_with_mqa``, ``q_b_proj``, ``kv_b_proj``, ``o_proj``)."""
    h, heads = moe.hidden, moe.heads
    kv, nope, rope, v = moe.kv_lora_rank, moe.qk_nope_head_dim, moe.qk_rope_head_dim, moe.v_head_dim
    assert kv is not None and nope is not None and rope is not None and v is not None  # MoeSpec checks MLA_FIELDS
    q_in = moe.q_lora_rank or h
    replicated = (h * moe.q_lora_rank if moe.q_lora_rank else 0) + h * (kv + rope)
    split = q_in * heads * (nope + rope) + kv * heads * (nope + v) + heads * v * h
    return replicated + split // t


def attention_params(moe: MoeSpec, d: Dims) -> int:
    """One layer's attention weights on one GPU (``d``: the attention's per-GPU sizes):
    MLA's (:func:`mla_attention_params`) or Q, K, V and the output projection as the
    dense footprint counts them (a replicated KV head counts on every GPU holding it)."""
    if moe.attention == "mla":
        return mla_attention_params(moe, d.n if d.sp else 1)
    return moe.hidden * (d.q_l + 2 * d.kv_l * d.head_dim) + d.q_l * moe.hidden


def weight_parts(moe: MoeSpec, gpus: int, d: Dims) -> dict[str, int]:
    """Parameters one GPU holds, by part (:data:`WEIGHT_PARTS`; module doc)."""
    t = d.n if d.sp else 1  # the attention's TP group
    h = moe.hidden
    vocab = 2 * -(-moe.vocab // t) * h if moe.vocab else 0
    return {"attention": moe.layers * attention_params(moe, d),
            "experts": moe.moe_layers * moe.experts * moe.expert_params() // gpus,
            "shared": moe.moe_layers * moe.shared_experts * moe.expert_params(),
            "router": moe.moe_layers * h * moe.experts,
            "dense_mlp": moe.dense_layers * 3 * h * -(-moe.dense_ffn_hidden // gpus),
            "embeddings": vocab}


def weight_bytes(moe: MoeSpec, parts: dict[str, int], mode: str) -> dict[str, int]:
    """Bytes of each weight part: the linear layers in ``weight_dtype_bytes`` outside
    training, the router and embeddings (and everything in train) in ``dtype_bytes``."""
    wide = ("router", "embeddings")
    wb = moe.dtype_bytes if mode == "train" else moe.weight_dtype_bytes
    return {k: p * (moe.dtype_bytes if k in wide else wb) for k, p in parts.items()}


def moe_kv_cache_bytes(moe: MoeSpec, d: Dims) -> int:
    """The KV cache of every layer on one GPU for ``d.batch`` sequences of ``d.kv_len``:
    MLA's latent and RoPE key (``kv_lora_rank + qk_rope_head_dim`` values per token and
    layer, whole on every attention-TP rank), else K and V of the GPU's KV heads."""
    if moe.attention == "mla":
        assert moe.kv_lora_rank is not None and moe.qk_rope_head_dim is not None
        width = moe.kv_lora_rank + moe.qk_rope_head_dim
        return moe.layers * width * moe.dtype_bytes * d.batch * d.kv_len
    return kv_cache_bytes(attention_model(moe), d)


def with_busiest(g: LayerGraph, received: Sequence[int] | None) -> LayerGraph:
    """``g`` with its receive-side tensors (:data:`RECEIVED`, the graph's mean over the
    GPUs) scaled to the busiest GPU's rows (``received``: each GPU's received rows)."""
    if not received or max(received) <= 0:
        return g
    most, total, n = max(received), sum(received), len(received)

    def busiest(t: Tensor) -> Tensor:
        return replace(t, local=(-(-t.local[0] * most * n // total), t.local[1]))
    return replace(g, tensors={name: busiest(t) if name in RECEIVED else t for name, t in g.tensors.items()})


def kept_for_backward(g: LayerGraph, forward_ops: int, dtype_bytes: int) -> int:
    """Bytes one MoE layer keeps for its backward on one GPU: the activation tensors
    the period's forward (its first ``forward_ops`` ops) reads or writes and its backward
    reads (no weights or weight gradients, no KV cache)."""
    fwd, bwd = g.ops[:forward_ops], g.ops[forward_ops:]
    in_fwd = {name for op in fwd for name in op.reads + op.writes}
    read_bwd = {name for op in bwd for name in op.reads}
    skip = weight_tensors(g) | EXPERT_WEIGHTS
    kept = [g.tensors[name] for name in sorted((in_fwd & read_bwd) - skip)]
    return sum(t.local[0] * t.local[1] * dtype_bytes for t in kept if t.sharding != "heads")


def split_name(gpus: int, group: int, expert_tp: int) -> str:
    """How the run splits the model, for messages: ``EP 8, attention TP 8`` (``group``:
    the attention TP group's GPUs, 1 data parallel)."""
    ep = f"EP {gpus // expert_tp}" + (f" x expert TP {expert_tp}" if expert_tp > 1 else "")
    return f"{ep}, attention {'TP ' + str(group) if group > 1 else 'data parallel'}"


def moe_footprint(model: MoeSpec, gpus: int, mode: str, attention: str = "tp", expert_tp: int = 1,
                  received: Sequence[int] | None = None, attention_tp: int | None = None,
                  mla_timing: str = "mla") -> MoeFootprint:
    """The per-GPU footprint of MoE ``model`` in ``mode`` (train, prefill, decode) over
    ``gpus`` GPUs, attention under ``attention`` (``tp``, ``dp``), experts split
    ``expert_tp`` ways (module doc); ``received``: the rows each GPU's experts receive
    under the run's routing (None: the mean, every GPU alike); ``attention_tp``: the
    attention's TP groups (cais.workload.moe_dataflow.attention_group; None: every GPU
    under ``tp``, one under ``dp``); ``mla_timing``: the graph whose activations are
    counted for an MLA model (``moe.mla_timing``: ``mha``, the stand-in's; ``mla``, MLA's
    own ops, its latent cache counted as the KV cache, not as an activation). A split
    that does not fit the model is a UserError naming the field."""
    ep_plan(model, gpus, expert_tp)
    group = attention_group(model, gpus, attention, attention_tp)
    d = moe_dims(model, gpus, mode, attention, attention_tp)
    b = model.dtype_bytes
    parts = weight_parts(model, gpus, d)
    params = sum(parts.values())
    by_part = weight_bytes(model, parts, mode)
    kv = moe_kv_cache_bytes(model, d) if mode in ("prefill", "decode") else 0
    g = with_busiest(build_moe_graph(model, gpus, mode, attention, 0, expert_tp, attention_tp, mla_timing), received)
    act = live_activation_bytes(g, b, EXPERT_WEIGHTS | LATENT_CACHE)
    grads = optim = 0
    if mode == "train":
        fwd_ops = len(build_moe_graph(model, gpus, "prefill", attention, 0, expert_tp, attention_tp, mla_timing).ops)
        act += (model.moe_layers - 1) * kept_for_backward(g, fwd_ops, b)
        if model.dense_layers:  # TP over every GPU (or the largest group it splits over), its groups' sequences
            tp = dense_tp_group(model, gpus)
            dm = dense_layer_model(model, model.batch * max(1, tp // group))
            act += model.dense_layers * stored_activation_bytes(dm, dims_for(dm, tp, "train", True))
        grads = params * b
        master = FP32_BYTES if b < FP32_BYTES else 0
        optim = params * (ADAM_STATES * FP32_BYTES + master)
    return MoeFootprint(model.name, mode, gpus, sum(by_part.values()), kv, act, grads, optim, weight_parts=by_part,
                        split=split_name(gpus, group, expert_tp))


__all__ = ["EXPERT_WEIGHTS", "LATENT_CACHE", "MoeFootprint", "RECEIVED", "WEIGHT_PARTS", "attention_params", "kept_for_backward",
           "mla_attention_params", "moe_footprint", "moe_kv_cache_bytes", "weight_parts"]
