"""One period of a mixture-of-experts (MoE) decoder layer as a dataflow graph, in the
dense path's vocabulary (:mod:`cais.workload.dataflow`): the same ops for attention and
the row-wise ops, plus the expert block's steps (router GEMM, top-k, permute, EP
dispatch, grouped GEMMs gate/up -> activation -> down, EP combine, unpermute), from
which :func:`cais.workload.graph.period_of` derives the period a scheme runs.

Attention runs as the dense path runs it, under tensor parallelism over every GPU
(``attention="tp"``: Megatron's TP with sequence parallelism: the output projection's
ReduceScatter leaves each GPU ``T / n`` token rows, which it routes, and an AllGather
before the next layer's QKV) or data parallel (``"dp"``: every GPU its own ``batch``
sequences, whole heads, no collective outside the experts), or under TP groups smaller
than the GPUs (``attention_tp`` N, 1 < N < GPUs: "DP x TP attention", as SGLang and vLLM
run DP attention with a TP group per DP rank): GPUs / N attention groups of N
consecutive GPUs, each its own ``batch`` sequences under TP over its N GPUs with
sequence parallelism, the out-projection's ReduceScatter and the next QKV's AllGather
within the group; each GPU routes its ``T / N`` rows. ``batch`` is per attention group
(so N = GPUs is ``tp``, whose ``batch`` is over every GPU, and N = 1 is ``dp``, whose
``batch`` is per GPU: :func:`attention_group`). The experts are split
over ``ep`` = GPUs / ``expert_tp`` EP ranks, each expert's FFN ``expert_tp`` ways
(expert tensor parallelism, as Megatron-Core's ``expert_tensor_parallel_size``:
gate/up split by columns, down by rows, so the grouped GEMMs run ``F / expert_tp``
wide and the down projection leaves partial sums). The GPUs are laid out as
Megatron-Core's expert rank order ``tp-ep`` (expert TP fastest): GPU ``g`` is EP rank
``g // expert_tp``, expert-TP slot ``g % expert_tp``; an expert-TP group is
``expert_tp`` consecutive GPUs (cais.workload.routing.expert_tp_routing).

With expert TP > 1 the forward adds, as Megatron-Core's all-to-all dispatcher
(NVIDIA/Megatron-LM@d98e8a64, ``megatron/core/transformer/moe/token_dispatcher.py``,
``MoEAlltoAllTokenDispatcher.dispatch_postprocess`` / ``combine_preprocess``; the
experts' split in ``experts.py``), an AllGather of the received rows over the
expert-TP group after the dispatch (``expert_tp_gather``) and a ReduceScatter of the
down projection's partial sums before the combine (``expert_tp_reduce``); in training
their conjugates (``*_bwd``: the ReduceScatter's backward an AllGather, the
AllGather's a ReduceScatter). A kernel whose stack exchanges over every GPU at once
(the ``all`` form: the all-gather and flex dispatchers) runs no such step: its
exchange carries the rows to every slot and its combine adds the partial sums.

An MLA model's attention (DeepSeek) runs MLA's own ops (``mla_timing`` = ``mla``, the
default, :func:`graph_mla`; cais.workload.mla), or the dense path's MHA stand-in where the
run asks for it (``mha``, as every result before MLA's ops ran): under ``mla`` the
period starts with MLA's attention (decode: the absorbed MQA over the latent cache
and ``v_absorb``) and ends with the next layer's ``qkv_a`` (replicated), the latent
norms, ``q_b`` and ``kv_b`` (decode: ``q_absorb``) where the stand-in has its QKV GEMM;
the backward has their gradients where the stand-in has the QKV's.

Forward (program order; ``side``: the shared experts, on a side stream a scheme may
overlap with the dispatch)::

    attention -> out-proj -> [RS] -> residual + norm (LN2) -> router GEMM -> top-k
      -> (shared experts: gate/up GEMM -> activation -> down GEMM, side)
      -> permute -> dispatch -> grouped GEMM gate/up -> activation -> grouped GEMM down
      -> combine -> unpermute -> residual + norm (LN1') -> [AG] -> next QKV GEMM

Backward (``train``): the conjugates in reverse; the backward of the combine is a
dispatch of the output gradient's rows and the backward of the dispatch a combine of
the input gradient's; each expert GEMM has a data-gradient grouped GEMM and a
weight-gradient grouped GEMM (grouped over K: each expert's rows). The forward's
gathered inputs are kept for the weight gradients (no re-gather).

The routed tensors' shapes here are the mean over the ranks (``tokens * topk / n``
rows); each GPU's rows come from the period's routing (:class:`~cais.workload.routing.Routing`),
which the scheme reads (docs/moe.md).
"""

from __future__ import annotations

from dataclasses import replace

from cais.errors import UserError
from cais.workload.dataflow import GemmOperands, LayerGraph, Op
from cais.workload.dims import MODES, Dims, dims_for
from cais.workload.graph import Period, period_of
from cais.workload.mla import MlaDims, mla_dims
from cais.workload.models import ModelError, ModelSpec
from cais.workload.moe import EpPlan, MoeSpec
from cais.workload.routing import Routing, expert_tp_routing, generate

ATTENTION_MODES = ("tp", "dp")
#: how an MLA model's attention is timed (``moe.mla_timing``; module doc)
MLA_TIMINGS = ("mha", "mla")


def attention_model(moe: MoeSpec) -> ModelSpec:
    """The dense model whose attention, norms and run shape are the MoE layer's (RMSNorm,
    SwiGLU; its dense MLP, never run here, the expert width): what the dense path's
    attention and row-wise kernels take."""
    return ModelSpec(name=moe.name, description=moe.description, family=moe.family, hidden=moe.hidden,
                     ffn_hidden=moe.expert_ffn_hidden, heads=moe.heads, kv_heads=moe.kv_heads, head_dim=moe.head_dim,
                     layers=moe.layers, gated_mlp=True, norm="rmsnorm", activation="swiglu", seq=moe.seq,
                     batch=moe.batch, dtype_bytes=moe.dtype_bytes, vocab=moe.vocab)


def dense_layer_model(moe: MoeSpec, batch: int | None = None) -> ModelSpec:
    """One of ``moe``'s first ``dense_layers`` layers as a dense model: the MoE layer's
    attention, norms and run shape (:func:`attention_model`) with the dense SwiGLU MLP
    of ``dense_ffn_hidden`` (DeepSeek-V3's ``first_k_dense_replace`` layers), ``layers``
    its ``dense_layers``; ``batch`` sequences (default: the model's)."""
    dm = attention_model(moe)
    data = {**dm.model_dump(), "ffn_hidden": moe.dense_ffn_hidden, "layers": max(1, moe.dense_layers),
            "batch": moe.batch if batch is None else batch}
    return ModelSpec.model_validate(data)


def dense_tp_group(moe: MoeSpec, n: int) -> int:
    """The GPUs one TP group of ``moe``'s dense first layers spans on ``n`` GPUs: all
    ``n`` where the dense layer (:func:`dense_layer_model`) splits over them, else the
    largest TP degree it splits over that divides ``n``, the groups side by side, each
    with its share of the sequences. DeepSeek-V3's 128 heads do not split over 72 GPUs:
    on nvl72 its dense layers run as 9 groups of TP 8."""
    dm = dense_layer_model(moe)
    return max(k for k in range(1, n + 1) if n % k == 0 and _fits(dm, k))


def _fits(model: ModelSpec, k: int) -> bool:
    """Whether ``model``'s layer splits over ``k`` TP ranks (``ModelSpec.check_tp``)."""
    try:
        model.check_tp(k)
    except ModelError:
        return False
    return True


def attention_group(moe: MoeSpec, n: int, attention: str, attention_tp: int | None = None) -> int:
    """The GPUs of one attention TP group on ``n`` GPUs (module doc): ``attention_tp``
    where given (it must divide the GPUs and ``moe``'s heads; under ``dp`` it must be 1),
    else every GPU under ``tp`` and 1 under ``dp``. A UserError (one line, naming the
    field and what it allows) otherwise."""
    if attention not in ATTENTION_MODES:
        raise UserError(f"attention: unknown '{attention}'; valid: {', '.join(ATTENTION_MODES)}")
    if attention_tp is None:
        return n if attention == "tp" else 1
    allowed = [k for k in range(1, n + 1) if n % k == 0 and _splits_heads(moe, k)]
    if isinstance(attention_tp, bool) or not isinstance(attention_tp, int) or attention_tp < 1 or n % attention_tp:
        raise UserError(f"attention_tp: {attention_tp} does not divide the {n} GPUs; allowed: "
                        f"{', '.join(map(str, allowed))}")
    if attention == "dp" and attention_tp != 1:
        raise UserError(f"attention_tp: {attention_tp} runs attention TP over groups of {attention_tp} GPUs, but "
                        "attention is 'dp' (data parallel: groups of 1); allowed with dp: 1 (or attention tp)")
    if not _splits_heads(moe, attention_tp):
        raise UserError(f"attention_tp: {attention_tp} does not divide {moe.name}'s heads ({moe.heads}) and kv_heads "
                        f"({moe.kv}); allowed: {', '.join(map(str, allowed))}")
    return attention_tp


def _splits_heads(moe: MoeSpec, k: int) -> bool:
    """Whether TP over ``k`` GPUs splits ``moe``'s heads (its KV heads split or replicated)."""
    return k == 1 or (moe.heads % k == 0 and (moe.kv < k or moe.kv % k == 0))


def moe_dims(moe: MoeSpec, n: int, mode: str, attention: str, attention_tp: int | None = None) -> Dims:
    """The attention part's per-GPU sizes: TP over the attention group's GPUs
    (:func:`attention_group`: every GPU under ``tp``) with sequence parallelism, its
    ``batch`` sequences, or one GPU's own sequences (a group of 1: ``dp``)."""
    group = attention_group(moe, n, attention, attention_tp)
    if mode not in MODES:
        raise UserError(f"mode: unknown mode '{mode}'; valid: {', '.join(MODES)}")
    model = attention_model(moe)
    return dims_for(model, group, mode, True) if group > 1 else dims_for(model, 1, mode, False)


def routed_rows(d: Dims) -> int:
    """Token rows one GPU routes: its sequence-parallel shard of its attention group's
    tokens (TP), or its own tokens (data parallel)."""
    return d.rows_l if d.sp else d.tokens


def ep_plan(moe: MoeSpec, n: int, expert_tp: int = 1) -> EpPlan:
    """The split of ``moe``'s experts over ``n`` GPUs at ``expert_tp`` (EP over the rest);
    a UserError (one line, naming the field and what it allows) where it does not split."""
    if expert_tp <= 0 or n % expert_tp:
        allowed = [k for k in range(1, n + 1) if n % k == 0 and moe.experts % (n // k) == 0
                   and moe.expert_ffn_hidden % k == 0]
        raise UserError(f"expert_tp: {expert_tp} does not divide the {n} GPUs; allowed: {', '.join(map(str, allowed))}")
    if moe.experts % (n // expert_tp):
        allowed = [k for k in range(1, moe.experts + 1) if moe.experts % k == 0 and k <= 1024]
        what = "EP ranks" if expert_tp == 1 else f"EP ranks ({n} GPUs / expert_tp {expert_tp})"
        raise UserError(f"gpus: {n // expert_tp} {what} do not divide {moe.name}'s {moe.experts} experts; "
                        f"allowed: {', '.join(map(str, allowed))}")
    # the experts' split only: attention's (its TP group, every GPU, or data parallel) is attention_group's
    return EpPlan(gpus=n, ep=n // expert_tp, expert_tp=expert_tp, attention_tp=1).check(moe)


def graph_mla(moe: MoeSpec, d: Dims, mla_timing: str) -> MlaDims | None:
    """The MLA widths a period of ``moe`` with dims ``d`` times its attention with:
    ``moe``'s own where ``mla_timing`` is ``mla`` and its attention is MLA, None (the
    dense path's attention: MLA's MHA stand-in) otherwise. A UserError (one line, naming
    ``moe.mla_timing``) for a value not in :data:`MLA_TIMINGS`."""
    if mla_timing not in MLA_TIMINGS:
        raise UserError(f"moe.mla_timing: unknown '{mla_timing}'; allowed: {', '.join(MLA_TIMINGS)}")
    return mla_dims(moe, d.heads_l) if mla_timing == "mla" else None


def build_moe_graph(moe: MoeSpec, n: int, mode: str, attention: str = "tp", seed: int = 0,
                    expert_tp: int = 1, attention_tp: int | None = None, mla_timing: str = "mla") -> LayerGraph:
    """The period of ``moe``'s MoE layer on ``n`` GPUs (EP over ``n / expert_tp`` ranks,
    each expert split ``expert_tp`` ways; attention over groups of ``attention_tp``
    GPUs, :func:`attention_group`) in ``mode`` (module doc); an MLA model's attention
    as MLA's own ops where ``mla_timing`` is ``mla`` (:func:`graph_mla`)."""
    ep_plan(moe, n, expert_tp)
    d = moe_dims(moe, n, mode, attention, attention_tp)
    mla = graph_mla(moe, d, mla_timing)
    g = LayerGraph(d, mode, moe=True)
    _MoeBuilder(g, moe, seed, expert_tp, mla).forward()
    if mode == "train":
        _MoeBuilder(g, moe, seed, expert_tp, mla).backward()
    return g


def build_moe_period(moe: MoeSpec, n: int, mode: str, attention: str = "tp", seed: int = 0,
                     routing: str = "uniform", routing_seed: int | None = None, expert_tp: int = 1,
                     form: str = "group", attention_tp: int | None = None, capacity_factor: float | None = None,
                     capacity: str = "none", mla_timing: str = "mla", **routing_kwargs: float) -> Period:
    """The period a scheme runs (:func:`build_moe_graph`), with its tokens' routing drawn
    by ``routing`` (cais.workload.routing; DeepEP's tests' ``uniform`` by default, its
    skew in ``routing_kwargs``: ``alpha``, ``sigma``) from ``routing_seed`` (default:
    ``seed``): each GPU routes :func:`routed_rows` tokens. At ``expert_tp`` > 1 the
    routing is over the GPUs' (expert, expert-TP slot) pairs as the EP kernel's stack
    sends them (``form``: cais.workload.routing.expert_tp_routing); the draw is the
    same at every ``expert_tp``. The period's ``attention_tp`` is its attention group's
    GPUs (:func:`attention_group`). ``capacity_factor`` and ``capacity`` bound what each
    GPU sends one expert (cais.workload.routing.generate: ``drop`` leaves the selections
    past capacity at -1, ``pad`` also fills every expert up to it, ``Routing.pad_rows``),
    applied to the draw before the expert-TP mapping, from the GPU's own routed tokens
    as Megatron-Core's ``get_capacity`` counts them. ``mla_timing``: :func:`graph_mla`
    (the period's ``mla``: its MLA widths where it times MLA's own ops)."""
    group = attention_group(moe, n, attention, attention_tp)
    graph = build_moe_graph(moe, n, mode, attention, seed, expert_tp, group, mla_timing)
    rows = routed_rows(graph.dims)
    ep = n // expert_tp
    rt: Routing = generate(routing, n, rows, moe.experts, moe.topk, seed if routing_seed is None else routing_seed,
                           n_group=moe.n_group, topk_group=moe.topk_group, ep=ep, capacity_factor=capacity_factor,
                           capacity=capacity, **routing_kwargs)  # type: ignore[arg-type]
    return replace(period_of(graph), routing=expert_tp_routing(rt, ep, expert_tp, form), expert_tp=expert_tp,
                   attention_tp=group, mla=graph_mla(moe, graph.dims, mla_timing))


class _MoeBuilder:
    """Adds one MoE period's tensors and ops to a graph (module doc)."""

    def __init__(self, g: LayerGraph, moe: MoeSpec, seed: int, expert_tp: int = 1, mla: MlaDims | None = None) -> None:
        self.g, self.moe, self.tp, self.seed = g, moe, g.dims.sp, seed  # attention under TP (its group's GPUs)
        self.mla = mla  # MLA's own ops (cais.workload.mla) where set, else the dense path's attention
        d = g.dims
        self.T, self.h, self.rl = d.tokens, d.hidden, routed_rows(d)
        self.F, self.E, self.K, self.S = moe.expert_ffn_hidden, moe.experts, moe.topk, moe.shared_experts
        self.sel = self.rl * self.K  # (token, expert) selections one GPU routes; the mean one receives
        self.etp = expert_tp
        self.Fl = self.F // expert_tp  # one GPU's slice of an expert's FFN width
        self.gsel = self.sel * expert_tp  # the rows one GPU's expert GEMMs take (its expert-TP group's)
        self.rows_sh = "rows" if self.tp else "replicated"

    def t(self, name: str, local: tuple[int, int], sharding: str | None = None,
          shape: tuple[int, int] | None = None) -> None:
        """Declare tensor ``name`` of per-GPU shape ``local``."""
        self.g.add_tensor(name, shape or local, sharding or "replicated", local)

    def gemm(self, name: str, m: int, n: int, k: int, ops: GemmOperands, role: str, side: bool = False) -> None:
        self.g.add(replace(Op.gemm(name, m, n, k, ops, role), side=side))

    def step(self, name: str, kind: str, inputs: dict[str, str], outputs: dict[str, str], kernel: str,
             role: str = "", m: int = 0, n: int = 0, k: int = 0, side: bool = False) -> None:
        self.g.add(Op(name, kind, inputs, outputs, kernel, "", m, n, k, None, role, side=side))

    # ---- forward ---------------------------------------------------------------------
    def forward(self) -> None:
        d, T, h, rl, E = self.g.dims, self.T, self.h, self.rl, self.E
        qkv_w = (d.heads_l + 2 * d.kv_l) * d.head_dim
        ow = d.q_l if self.mla is None else self.mla.out  # the attention output's width: the out-proj's K
        mha = self.mla is None
        for name, local in ((("qkv", (T, qkv_w)),) if mha else ()) + (
                ("a", (T, ow)), ("wo", (ow, h)), ("w_router", (h, E)),
                ("logits", (rl, E)), ("topk", (rl, 2 * self.K)), ("xp", (self.sel, h)),
                ("recv", (self.sel, h)), ("cb", (self.sel, h))) + (
                (("wqkv_next", (h, qkv_w)), ("qkv_next", (T, qkv_w))) if mha else ()):
            self.t(name, local)
        Fl, gs = self.Fl, self.gsel
        for name, local, split in (("we1", (h, 2 * Fl), "cols"), ("ef", (gs, 2 * Fl), "cols"),
                                   ("eg", (gs, Fl), "cols"), ("we2", (Fl, h), "rows"), ("eo", (gs, h), "partial")):
            self.t(name, local, "replicated" if self.etp == 1 else split)
        for name in ("x1", "zo", "x2", "n2", "zf", "x3", "n1"):
            self.t(name, (rl, h), self.rows_sh)
        if mha:
            attn_in = {"qkv": "qkv"}
            if self.g.mode == "decode":
                for name in ("kcache", "vcache"):
                    self.t(name, (d.batch * d.kv_l * d.kv_len, d.head_dim), "heads")
                    attn_in[name] = name
            self.g.add(Op("attention", "attention", attn_in, {"a": "a"}, "attention"))
        else:
            self._mla_attention()
        ln2 = Op("dropout_add_ln2", "rowop", {"x": "x1", "z": "zo"}, {"x": "x2", "n": "n2"}, "residual_norm",
                 norm="ln2", seed=self.seed)
        if self.tp:  # out-proj -> ReduceScatter -> LN2 -> router: the dense path's sub-layer L1
            self.t("zo_p", (T, h), "partial")
            self.g.add(replace(Op.gemm("out_proj", T, h, ow, GemmOperands("a", "wo", "zo_p"), "fwd"), sublayer="L1"))
            self.g.add(Op("L1.reduce", "reduce", {"x": "zo_p"}, {"y": "zo"}, "reducescatter", "L1"))
        else:
            self.gemm("out_proj", T, h, ow, GemmOperands("a", "wo", "zo"), "fwd")
        self.g.add(ln2)
        self.gemm("router", rl, E, h, GemmOperands("n2", "w_router", "logits"), "fwd")
        self.step("topk", "route", {"logits": "logits"}, {"topk": "topk"}, "topk")
        if self.S:
            self._shared_forward()
        self.step("permute", "permute", {"x": "n2", "topk": "topk"}, {"y": "xp"}, "permute")
        self.step("dispatch", "exchange", {"x": "xp"}, {"y": "recv"}, "dispatch")
        xin, out = "recv", "eo"
        if self.etp > 1:  # the expert-TP group's rows in, its partial sums reduced back out (module doc)
            xin, out = "recv_g", "eo_r"
            self.t("recv_g", (self.gsel, h))
            self.t("eo_r", (self.sel, h))
            self.step("expert_tp_gather", "expert_tp", {"x": "recv"}, {"y": "recv_g"}, "allgather")
        Fl = self.Fl
        self.step("expert_fc1", "grouped_gemm", {"a": xin, "b": "we1"}, {"c": "ef"}, "fc1", "fwd", 0, 2 * Fl, h)
        self.step("expert_act", "expert_act", {"f": "ef"}, {"g": "eg"}, "act", "fwd", 0, Fl)
        self.step("expert_fc2", "grouped_gemm", {"a": "eg", "b": "we2"}, {"c": "eo"}, "fc2", "fwd", 0, h, Fl)
        if self.etp > 1:
            self.step("expert_tp_reduce", "expert_tp", {"x": "eo"}, {"y": "eo_r"}, "reducescatter")
        self.step("combine", "exchange", {"x": out}, {"y": "cb"}, "combine")
        self.step("unpermute", "permute", {"x": "cb", "topk": "topk"}, {"y": "zf"}, "unpermute")
        z = {"x": "x2", "z": "zf", **({"s": "so"} if self.S else {})}
        self.g.add(Op("add_ln1", "rowop", z, {"x": "x3", "n": "n1"}, "residual_norm", norm="ln1n",
                      seed=self.seed + 1))
        if self.tp:
            self.t("n1g", (T, h))
            self.g.add(Op("gather_n1", "gather", {"x": "n1"}, {"y": "n1g"}, "allgather", role="feed"))
        if mha:
            self.gemm("qkv", T, qkv_w, h, GemmOperands("n1g" if self.tp else "n1", "wqkv_next", "qkv_next"), "fwd")
        else:
            self._mla_projections("n1g" if self.tp else "n1")

    # ---- MLA (cais.workload.mla) ----------------------------------------------------
    def _mla_attention(self) -> None:
        """MLA's attention at the period's start: in decode the absorbed form (MQA over
        the latent cache, then W_UV per head: ``v_absorb``), else MHA over the expanded
        K and V (score width nope + rope, value width v). The queries and keys it reads
        are the previous layer's (the period ends with the next layer's projections)."""
        mla, d, T = self.mla, self.g.dims, self.T
        assert mla is not None
        if self.g.mode == "decode":
            # the latent cache of the GPU's sequences: every GPU of an attention TP group holds all of it
            for name, local in (("q_abs", (T, mla.q_latent)), ("ckv_cache", (d.batch * d.kv_len, mla.latent)),
                                ("o_lat", (T, mla.o_latent)), ("o_head", (T, mla.kv_lora)),
                                ("w_uv", (mla.kv_lora, mla.out))):
                self.t(name, local)
            self.g.add(Op("attention", "attention", {"q": "q_abs", "cache": "ckv_cache"}, {"o": "o_lat"},
                          "mla_attention"))
            # W_UV as one GEMM of every head's weights and FLOPs (A: one head's [T, kv_lora] view)
            self.gemm("v_absorb", T, mla.out, mla.kv_lora, GemmOperands("o_head", "w_uv", "a"), "fwd")
            return
        for name, local in (("q", (T, mla.q_width)), ("kv", (T, mla.kv_b))):
            self.t(name, local)
        self.g.add(Op("attention", "attention", {"q": "q", "kv": "kv"}, {"a": "a"}, "mla_attention"))

    def _mla_projections(self, src: str) -> None:
        """The next layer's MLA input side from the normed rows ``src`` (the attention
        group's gathered rows under TP): the replicated ``qkv_a`` GEMM (every GPU of a
        group on all the group's rows), the latent RMSNorms, the column-parallel ``q_b``
        (``q_proj`` from ``src`` without a query latent), then ``q_absorb`` (W_UK per head)
        in decode or ``kv_b`` otherwise."""
        mla, T, h = self.mla, self.T, self.h
        assert mla is not None
        for name, local in (("w_qkv_a", (h, mla.qkv_a)), ("qkv_a_next", (T, mla.qkv_a)), ("ckv", (T, mla.kv_lora)),
                            ("ckvn", (T, mla.kv_lora)), ("w_q_b", (mla.q_lora or h, mla.q_width)),
                            ("q_next", (T, mla.q_width))):
            self.t(name, local)
        self.gemm("qkv_a", T, mla.qkv_a, h, GemmOperands(src, "w_qkv_a", "qkv_a_next"), "fwd")
        if mla.q_lora:
            for name in ("cq", "cqn"):
                self.t(name, (T, mla.q_lora))
            self.g.add(Op("q_a_norm", "norm", {"x": "cq"}, {"y": "cqn"}, "q_a_norm"))
        self.g.add(Op("kv_a_norm", "norm", {"x": "ckv"}, {"y": "ckvn"}, "kv_a_norm"))
        if mla.q_lora:
            self.gemm("q_b", T, mla.q_width, mla.q_lora, GemmOperands("cqn", "w_q_b", "q_next"), "fwd")
        else:
            self.gemm("q_proj", T, mla.q_width, h, GemmOperands(src, "w_q_b", "q_next"), "fwd")
        if self.g.mode == "decode":
            # W_UK as one GEMM of every head's weights and FLOPs (A: one head's [T, nope] view of q)
            for name, local in (("q_nope", (T, mla.nope)), ("w_uk", (mla.nope, mla.heads_l * mla.kv_lora)),
                                ("q_abs_next", (T, mla.heads_l * mla.kv_lora))):
                self.t(name, local)
            self.gemm("q_absorb", T, mla.heads_l * mla.kv_lora, mla.nope, GemmOperands("q_nope", "w_uk", "q_abs_next"),
                      "fwd")
        else:
            for name, local in (("w_kv_b", (mla.kv_lora, mla.kv_b)), ("kv_next", (T, mla.kv_b))):
                self.t(name, local)
            self.gemm("kv_b", T, mla.kv_b, mla.kv_lora, GemmOperands("ckvn", "w_kv_b", "kv_next"), "fwd")

    def _shared_forward(self) -> None:
        rl, h, w = self.rl, self.h, self.S * self.F
        for name, local in (("ws1", (h, 2 * w)), ("sf", (rl, 2 * w)), ("sg", (rl, w)), ("ws2", (w, h)),
                            ("so", (rl, h))):
            self.t(name, local)
        self.gemm("shared_fc1", rl, 2 * w, h, GemmOperands("n2", "ws1", "sf"), "fwd", side=True)
        self.step("shared_act", "expert_act", {"f": "sf"}, {"g": "sg"}, "act", "fwd", rl, w, side=True)
        self.gemm("shared_fc2", rl, h, w, GemmOperands("sg", "ws2", "so"), "fwd", side=True)

    # ---- backward --------------------------------------------------------------------
    def backward(self) -> None:
        d, T, h, rl, E = self.g.dims, self.T, self.h, self.rl, self.E
        qkv_w = (d.heads_l + 2 * d.kv_l) * d.head_dim
        Fl, gs = self.Fl, self.gsel
        mha = self.mla is None
        ow = d.q_l if self.mla is None else self.mla.out
        for name, local in ((("dqkv_next", (T, qkv_w)), ("dwqkv_next", (h, qkv_w))) if mha else ()) + (
                ("dcb", (self.sel, h)), ("deo", (gs, h)), ("deg", (gs, Fl)), ("dwe2", (Fl, h)),
                ("def", (gs, 2 * Fl)), ("dwe1", (h, 2 * Fl)), ("drecv", (gs, h)),
                ("dxp", (self.sel, h)), ("dlogits", (rl, E)), ("dw_router", (h, E)),
                ("da", (T, ow)), ("dwo", (ow, h))) + ((("dqkv", (T, qkv_w)),) if mha else ()):
            self.t(name, local)
        for name in ("dx3_res", "dn1", "dx3", "dzf", "dn2", "dx2", "dzo"):
            self.t(name, (rl, h), self.rows_sh)
        dn1 = "dn1_p" if self.tp else "dn1"
        if self.tp:
            self.t("dn1_p", (T, h), "partial")
        if mha:
            self.gemm("qkv_dgrad", T, h, qkv_w, GemmOperands("dqkv_next", "wqkv_next", dn1, tb=True), "dgrad")
        else:
            self._mla_projections_dgrad(dn1)
        if self.tp:
            self.g.add(Op("bwd.reduce", "reduce", {"x": "dn1_p"}, {"y": "dn1"}, "reducescatter"))
        self.g.add(Op("ln1_bwd", "rowop", {"dres": "dx3_res", "dz": "dn1", "x": "x3"}, {"dx": "dx3", "dzo": "dzf"},
                      "norm_bwd", norm="ln1n", seed=self.seed + 1))
        self.step("unpermute_bwd", "permute", {"x": "dzf", "topk": "topk"}, {"y": "dcb"}, "unpermute_bwd")
        if self.S:
            self._shared_backward()
        # the combine's backward: the output gradient's rows go where the experts are (a dispatch)
        dout, din, xin = "deo", "drecv", "recv"
        if self.etp > 1:
            dout, din, xin = "deo_r", "drecv_r", "recv_g"
            self.t("deo_r", (self.sel, h))
            self.t("drecv_r", (self.sel, h))
        self.step("combine_bwd", "exchange", {"x": "dcb"}, {"y": dout}, "dispatch")
        if self.etp > 1:  # the ReduceScatter's backward: the group's output-gradient rows gathered
            self.step("expert_tp_reduce_bwd", "expert_tp", {"x": dout}, {"y": "deo"}, "allgather")
        self.step("expert_fc2_dgrad", "grouped_gemm", {"a": "deo", "b": "we2"}, {"c": "deg"}, "fc2", "dgrad", 0, Fl,
                  h)
        self.step("expert_fc2_wgrad", "grouped_gemm", {"a": "eg", "b": "deo"}, {"c": "dwe2"}, "fc2", "wgrad", Fl, h)
        self.step("expert_act_bwd", "expert_act", {"dg": "deg", "f": "ef"}, {"df": "def"}, "act_bwd", "dgrad", 0, Fl)
        self.step("expert_fc1_dgrad", "grouped_gemm", {"a": "def", "b": "we1"}, {"c": "drecv"}, "fc1", "dgrad", 0, h,
                  2 * Fl)
        self.step("expert_fc1_wgrad", "grouped_gemm", {"a": xin, "b": "def"}, {"c": "dwe1"}, "fc1", "wgrad", h,
                  2 * Fl)
        if self.etp > 1:  # the AllGather's backward: the input gradient's partial sums reduced
            self.step("expert_tp_gather_bwd", "expert_tp", {"x": "drecv"}, {"y": din}, "reducescatter")
        # the dispatch's backward: the input gradient's rows go back to their tokens (a combine)
        self.step("dispatch_bwd", "exchange", {"x": din}, {"y": "dxp"}, "combine")
        self.step("permute_bwd", "permute", {"x": "dxp", "topk": "topk"}, {"y": "dn2"}, "permute_bwd")
        self.step("topk_bwd", "route", {"topk": "topk", "logits": "logits"}, {"d": "dlogits"}, "topk_bwd")
        self.t("dn2r", (rl, h))
        self.gemm("router_dgrad", rl, h, E, GemmOperands("dlogits", "w_router", "dn2r", tb=True), "dgrad")
        self.gemm("router_wgrad", h, E, rl, GemmOperands("n2", "dlogits", "dw_router", ta=True), "wgrad")
        dz = {"dz": "dn2", "dr": "dn2r", **({"ds": "dsn"} if self.S else {})}
        self.g.add(Op("ln2_bwd", "rowop", {"dres": "dx3", **dz, "x": "x2"}, {"dx": "dx2", "dzo": "dzo"},
                      "norm_bwd", norm="ln2", seed=self.seed))
        grad = "dzo"
        if self.tp:
            self.t("dzog", (T, h))
            self.g.add(Op("gather_dzo", "gather", {"x": "dzo"}, {"y": "dzog"}, "allgather", role="feed"))
            grad = "dzog"
        self.gemm("out_proj_dgrad", T, ow, h, GemmOperands(grad, "wo", "da", tb=True), "dgrad")
        if mha:
            self.gemm("qkv_wgrad", h, qkv_w, T, GemmOperands("n1g" if self.tp else "n1", "dqkv_next", "dwqkv_next",
                                                              ta=True), "wgrad")
        else:
            self._mla_projections_wgrad("n1g" if self.tp else "n1")
        self.gemm("out_proj_wgrad", ow, h, T, GemmOperands("a", grad, "dwo", ta=True), "wgrad")
        if mha:
            self.g.add(Op("attention_bwd", "attention", {"da": "da", "qkv": "qkv"}, {"dqkv": "dqkv"},
                          "attention_bwd"))
        else:
            self.g.add(Op("attention_bwd", "attention", {"da": "da", "q": "q", "kv": "kv"}, {"dq": "dq", "dkv": "dkv"},
                          "mla_attention_bwd"))

    def _mla_projections_dgrad(self, dst: str) -> None:
        """The data gradients of the next layer's MLA input side, into ``dst`` (partial
        sums over the group's heads under TP, reduced after as the QKV's are): ``kv_b``'s
        and ``q_b``'s (column parallel: partial latent gradients), the latent norms'
        backwards, then the replicated ``qkv_a``'s (``q_proj``'s beside it without a
        query latent)."""
        mla, T, h = self.mla, self.T, self.h
        assert mla is not None
        for name, local in (("dkv_next", (T, mla.kv_b)), ("dq_next", (T, mla.q_width)), ("dckvn", (T, mla.kv_lora)),
                            ("dckv", (T, mla.kv_lora)), ("dqkv_a", (T, mla.qkv_a)), ("dq", (T, mla.q_width)),
                            ("dkv", (T, mla.kv_b))):
            self.t(name, local)
        self.gemm("kv_b_dgrad", T, mla.kv_lora, mla.kv_b, GemmOperands("dkv_next", "w_kv_b", "dckvn", tb=True), "dgrad")
        if mla.q_lora:
            for name in ("dcqn", "dcq"):
                self.t(name, (T, mla.q_lora))
            self.gemm("q_b_dgrad", T, mla.q_lora, mla.q_width, GemmOperands("dq_next", "w_q_b", "dcqn", tb=True),
                      "dgrad")
            self.g.add(Op("q_a_norm_bwd", "norm", {"dy": "dcqn", "x": "cq"}, {"dx": "dcq"}, "q_a_norm_bwd"))
        self.g.add(Op("kv_a_norm_bwd", "norm", {"dy": "dckvn", "x": "ckv"}, {"dx": "dckv"}, "kv_a_norm_bwd"))
        self.gemm("qkv_a_dgrad", T, h, mla.qkv_a, GemmOperands("dqkv_a", "w_qkv_a", dst, tb=True), "dgrad")
        if not mla.q_lora:  # the full query's data gradient adds into the same rows
            self.gemm("q_proj_dgrad", T, h, mla.q_width, GemmOperands("dq_next", "w_q_b", dst, tb=True), "dgrad")

    def _mla_projections_wgrad(self, src: str) -> None:
        """The weight gradients of the next layer's MLA input side (``src``: the rows its
        ``qkv_a`` read): ``qkv_a``'s (replicated: each GPU of a group its copy's, summed
        with the data-parallel gradients, outside the period), ``q_b``'s (``q_proj``'s) and
        ``kv_b``'s."""
        mla, T, h = self.mla, self.T, self.h
        assert mla is not None
        for name, local in (("dw_qkv_a", (h, mla.qkv_a)), ("dw_q_b", (mla.q_lora or h, mla.q_width)),
                            ("dw_kv_b", (mla.kv_lora, mla.kv_b))):
            self.t(name, local)
        self.gemm("qkv_a_wgrad", h, mla.qkv_a, T, GemmOperands(src, "dqkv_a", "dw_qkv_a", ta=True), "wgrad")
        if mla.q_lora:
            self.gemm("q_b_wgrad", mla.q_lora, mla.q_width, T, GemmOperands("cqn", "dq_next", "dw_q_b", ta=True),
                      "wgrad")
        else:
            self.gemm("q_proj_wgrad", h, mla.q_width, T, GemmOperands(src, "dq_next", "dw_q_b", ta=True), "wgrad")
        self.gemm("kv_b_wgrad", mla.kv_lora, mla.kv_b, T, GemmOperands("ckvn", "dkv_next", "dw_kv_b", ta=True),
                  "wgrad")

    def _shared_backward(self) -> None:
        rl, h, w = self.rl, self.h, self.S * self.F
        for name, local in (("dsg", (rl, w)), ("dws2", (w, h)), ("dsf", (rl, 2 * w)), ("dws1", (h, 2 * w)),
                            ("dsn", (rl, h))):
            self.t(name, local)
        self.gemm("shared_fc2_dgrad", rl, w, h, GemmOperands("dzf", "ws2", "dsg", tb=True), "dgrad", side=True)
        self.gemm("shared_fc2_wgrad", w, h, rl, GemmOperands("sg", "dzf", "dws2", ta=True), "wgrad", side=True)
        self.step("shared_act_bwd", "expert_act", {"dg": "dsg", "f": "sf"}, {"df": "dsf"}, "act_bwd", "dgrad", rl, w,
                  side=True)
        self.gemm("shared_fc1_dgrad", rl, h, 2 * w, GemmOperands("dsf", "ws1", "dsn", tb=True), "dgrad", side=True)
        self.gemm("shared_fc1_wgrad", h, 2 * w, rl, GemmOperands("n2", "dsf", "dws1", ta=True), "wgrad", side=True)
