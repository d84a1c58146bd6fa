"""The layer as a dataflow graph: the tensors every GPU holds a part of, and the ops
that read and write them, in program order. One repeating period of a Megatron
tensor-parallel transformer stack (docs/layer-semantics.md): attention, out-proj,
residual + LN2, FC1, activation, FC2, residual + LN1 of the next layer, its QKV
(forward), and their conjugates (backward, ``train``).

The communication is in the graph: a row-parallel GEMM writes a ``partial`` tensor
that a ``reduce`` op (ReduceScatter with sequence parallelism, AllReduce without)
turns into token rows, and a ``gather`` op (AllGather, SP only) turns token-sharded
rows back into the full rows a column-parallel GEMM reads. :meth:`LayerGraph.chains`
finds the paper's fused sub-layers, GEMM -> reduce -> row-wise op -> (gather) ->
GEMM; ``cais.workload.graph`` derives a scheme's :class:`~cais.workload.graph.Period`
from the graph, and the CAIS passes (``cais.opt``) work on it.

Tensor names are the per-GPU buffer names of the period (``PeriodBuffers``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from cais.errors import UserError
from cais.workload.dims import MODES, Dims, dims_for
from cais.workload.models import ModelSpec

SHARDINGS = ("rows", "cols", "replicated", "partial", "heads")
#: the kinds of a MoE period's expert block (cais.workload.moe_dataflow; graph.MoeStep)
MOE_KINDS = ("route", "permute", "exchange", "grouped_gemm", "expert_act", "expert_tp")
OP_KINDS = ("gemm", "rowop", "attention", "activation", "norm", "reduce", "gather", *MOE_KINDS)


@dataclass(frozen=True)
class GemmOperands:
    """Where a GEMM's operands live in one GPU's memory: A is ``a`` ([M,K], or [K,M]
    if ``ta``), B is ``b`` ([K,N], or [N,K] if ``tb``), C is ``c`` ([M,N])."""

    a: str
    b: str
    c: str
    ta: bool = False
    tb: bool = False


@dataclass(frozen=True)
class Tensor:
    """A matrix of the unsharded layer and how the GPUs hold it.

    ``shape`` is the global (rows, cols); ``sharding`` says what each GPU's buffer
    ``name`` of shape ``local`` holds of it: ``rows`` (split by rows: the token rows
    of a sequence-parallel activation, or the K rows of a row-parallel weight),
    ``cols`` (split by columns: heads, FFN units), ``replicated`` (all of it, on every
    GPU), ``partial`` (all of it as a per-GPU partial sum, to be reduced) or ``heads``
    (the KV cache, [batch, heads, len, dim] split by head). ``local`` is the split of
    ``shape``, except that kv heads replicated when kv_heads < n count on every GPU."""

    name: str
    shape: tuple[int, int]
    sharding: str
    local: tuple[int, int]

    def __post_init__(self) -> None:
        if self.sharding not in SHARDINGS:
            raise ValueError(f"tensor {self.name}: unknown sharding '{self.sharding}'; valid: {', '.join(SHARDINGS)}")


@dataclass(frozen=True)
class Op:
    """One operation of the layer, run by every GPU on its part of its tensors.

    ``kind`` is one of :data:`OP_KINDS`; ``kernel`` the variant that runs it
    (rowop: ``residual_norm`` | ``norm_bwd``; attention: ``attention`` |
    ``attention_bwd`` (MLA's: ``mla_attention`` | ``mla_attention_bwd``); activation:
    ``act`` | ``act_bwd``; norm (a norm without a residual, MLA's latent RMSNorms):
    ``q_a_norm`` | ``kv_a_norm`` and their ``*_bwd``; reduce: ``reducescatter`` |
    ``allreduce``; gather: ``allgather``; gemm: ``gemm``). ``inputs`` and ``outputs``
    map the op's roles to tensor names (a GEMM's are ``a``, ``b`` and ``c``; a reduce's
    and a gather's ``x`` and ``y``). A GEMM also has its per-GPU ``m``, ``n``, ``k``,
    its ``operands`` and ``role`` (fwd, dgrad, wgrad); a row-wise op the prefix of its
    norm weights (``norm``) and its dropout ``seed``. ``sublayer`` names the paper's
    fused sub-layer (L1..L4) the op belongs to, if any."""

    name: str
    kind: str
    inputs: dict[str, str]
    outputs: dict[str, str]
    kernel: str = ""
    sublayer: str = ""
    m: int = 0
    n: int = 0
    k: int = 0
    operands: GemmOperands | None = None
    role: str = ""
    norm: str = ""
    seed: int = 0
    side: bool = False  # runs on a side stream (a MoE layer's shared experts)

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS:
            raise ValueError(f"op {self.name}: unknown kind '{self.kind}'; valid: {', '.join(OP_KINDS)}")

    @classmethod
    def gemm(cls, name: str, m: int, n: int, k: int, ops: GemmOperands, role: str, sublayer: str = "") -> "Op":
        """C[m,n] = op(A) @ op(B) on every GPU, reading and writing ``ops``."""
        return cls(name, "gemm", {"a": ops.a, "b": ops.b}, {"c": ops.c}, "gemm", sublayer, m, n, k, ops, role)

    @property
    def reads(self) -> tuple[str, ...]:
        return tuple(self.inputs.values())

    @property
    def writes(self) -> tuple[str, ...]:
        return tuple(self.outputs.values())


@dataclass(frozen=True)
class GraphChain:
    """A paper sub-layer found in the graph: ``gemm1`` writes partial sums, ``reduce``
    sums them into token rows, ``rowop`` computes on those rows, ``gather`` (SP only)
    collects its output ``feed`` from every GPU, and ``gemm2`` reads the gathered rows
    (or ``feed`` itself, without SP) as its A."""

    name: str
    gemm1: Op
    reduce: Op
    rowop: Op
    gather: Op | None
    gemm2: Op
    feed: str

    @property
    def ops(self) -> tuple[Op, ...]:
        return tuple(op for op in (self.gemm1, self.reduce, self.rowop, self.gather, self.gemm2) if op is not None)

    @property
    def partial(self) -> str:
        return self.reduce.inputs["x"]

    @property
    def reduced(self) -> str:
        return self.reduce.outputs["y"]

    @property
    def gathered(self) -> str:
        """What GEMM2 reads: the gathered rows, or ``feed`` without a gather."""
        return self.gather.outputs["y"] if self.gather is not None else self.feed


@dataclass
class LayerGraph:
    """One period of a layer as a dataflow graph: ``ops`` in program order, over the
    ``tensors`` (by name, in declaration order) they read and write; ``dims`` are the
    per-GPU sizes it was built for."""

    dims: Dims
    mode: str
    ops: list[Op] = field(default_factory=list)
    tensors: dict[str, Tensor] = field(default_factory=dict)
    moe: bool = False  # a MoE layer's period (cais.workload.moe_dataflow): reduces and row-wise ops may stand alone

    def add_tensor(self, name: str, shape: tuple[int, int], sharding: str, local: tuple[int, int]) -> None:
        if name in self.tensors:
            raise ValueError(f"tensor {name} declared twice")
        self.tensors[name] = Tensor(name, shape, sharding, local)

    def add(self, op: Op) -> None:
        unknown = [t for t in op.reads + op.writes if t not in self.tensors]
        if unknown:
            raise ValueError(f"op {op.name}: undeclared tensors {', '.join(unknown)}")
        if any(o.name == op.name for o in self.ops):
            raise ValueError(f"op {op.name} added twice")
        self.ops.append(op)

    def op(self, name: str) -> Op:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(f"no op {name}")

    def index(self, op: Op) -> int:
        """Position of ``op`` in program order."""
        return next(i for i, o in enumerate(self.ops) if o.name == op.name)

    def producers(self, tensor: str) -> list[Op]:
        """Ops that write ``tensor``, in program order (a re-gather writes again)."""
        return [o for o in self.ops if tensor in o.writes]

    def consumers(self, tensor: str) -> list[Op]:
        """Ops that read ``tensor``, in program order."""
        return [o for o in self.ops if tensor in o.reads]

    def inputs(self) -> list[str]:
        """Period inputs: tensors read but never written (activations from the previous
        period, weights, gradients from the next one)."""
        written = {t for o in self.ops for t in o.writes}
        return [t for t in self.tensors if t not in written and self.consumers(t)]

    def _next(self, after: Op, tensor: str, kinds: tuple[str, ...]) -> Op | None:
        """The first op after ``after`` that reads ``tensor``, if it is of one of ``kinds``."""
        i = self.index(after)
        later = [o for o in self.consumers(tensor) if self.index(o) > i]
        return later[0] if later and later[0].kind in kinds else None

    def chains(self) -> list[GraphChain]:
        """Every GEMM -> reduce -> row-wise op -> (gather) -> GEMM in program order:
        each step is the next reader of what the previous one wrote; GEMM2 is the next
        GEMM reading (the gathered form of) one of the row-wise op's outputs."""
        out = []
        for g1 in (o for o in self.ops if o.kind == "gemm"):
            red = self._next(g1, g1.outputs["c"], ("reduce",))
            if red is None:
                continue
            row = self._next(red, red.outputs["y"], ("rowop",))
            if row is None:
                continue
            for feed in row.writes:
                nxt = self._next(row, feed, ("gather", "gemm"))
                gather = nxt if nxt is not None and nxt.kind == "gather" else None
                g2 = self._next(gather, gather.outputs["y"], ("gemm",)) if gather is not None else nxt
                if g2 is not None:
                    out.append(GraphChain(g1.sublayer or g1.name, g1, red, row, gather, g2, feed))
                    break
        return out

    def chain(self, name: str) -> GraphChain:
        for c in self.chains():
            if c.name == name:
                return c
        raise KeyError(f"no chain {name}")

    def problems(self) -> list[str]:
        """Broken invariants, as messages: an op reads a tensor that is written only
        later; a GEMM's operands do not have the shapes its M, N, K say."""
        bad = []
        first_write: dict[str, int] = {}
        for i, o in enumerate(self.ops):
            for t in o.reads:
                if t in first_write or not self.producers(t):
                    continue
                bad.append(f"{o.name} reads {t} before it is written")
            for t in o.writes:
                first_write.setdefault(t, i)
            if o.kind == "gemm":
                bad += _gemm_shape_problems(o, self.tensors)
        return bad


def _gemm_shape_problems(o: Op, tensors: dict[str, Tensor]) -> list[str]:
    ops = o.operands
    if ops is None:
        return [f"{o.name}: a GEMM without operands"]
    want = {ops.a: (o.k, o.m) if ops.ta else (o.m, o.k), ops.b: (o.n, o.k) if ops.tb else (o.k, o.n),
            ops.c: (o.m, o.n)}
    return [f"{o.name}: {name} is {tensors[name].local}, the GEMM needs {shape}"
            for name, shape in want.items() if tensors[name].local != shape]


# ---- the period of a Megatron TP layer ---------------------------------------------

def build_graph(model: ModelSpec, n: int, mode: str, sp: bool, seed: int = 0, regather: bool = True,
                kv_len: int | None = None) -> LayerGraph:
    """The period of ``model`` on ``n`` GPUs as a graph: ``train`` (forward +
    backward), ``prefill`` (forward) or ``decode`` (forward of one new token per
    sequence); ``sp``: sequence parallelism; ``regather``: the backward re-gathers the
    token-sharded inputs of the weight gradients (Megatron frees the gathered copy)."""
    if mode not in MODES:
        raise UserError(f"mode: unknown mode '{mode}'; valid: {', '.join(MODES)}")
    d = dims_for(model, n, mode, sp, kv_len)
    g = LayerGraph(d, mode)
    _forward(g, model, seed)
    if mode == "train":
        _backward(g, model, seed, regather)
    return g


@dataclass(frozen=True)
class _Widths:
    """Global widths of the layer's column-sharded tensors."""

    q: int
    qkv: int
    ffn: int
    fc1: int


def _widths(model: ModelSpec) -> _Widths:
    ffn = model.ffn_hidden
    return _Widths(model.heads * model.dim, (model.heads + 2 * model.kv) * model.dim, ffn,
                   2 * ffn if model.gated_mlp else ffn)


def _context(g: LayerGraph, model: ModelSpec) -> tuple[Dims, _Widths, int, int, int, str, Callable[[str], str]]:
    """What the forward and backward builders share: dims, widths, tokens, hidden,
    rows per GPU, the sharding of activations between GEMMs, and the name of a
    gathered activation."""
    d = g.dims
    act = "rows" if d.sp else "replicated"
    gath: Callable[[str], str] = (lambda s: s + "g") if d.sp else (lambda s: s)
    return d, _widths(model), d.tokens, d.hidden, d.rows_l, act, gath


def _sublayer(g: LayerGraph, name: str, gemm1: Op, reduced: str, rowop: Op, feed: str, gemm2: Op) -> None:
    """GEMM1 -> reduce (RS, or AR without SP) -> row-wise op -> gather (SP) -> GEMM2."""
    sp = g.dims.sp
    g.add(replace(gemm1, sublayer=name))
    g.add(Op(f"{name}.reduce", "reduce", {"x": gemm1.outputs["c"]}, {"y": reduced},
             "reducescatter" if sp else "allreduce", name))
    g.add(replace(rowop, sublayer=name))
    if sp:
        g.add(Op(f"{name}.gather", "gather", {"x": feed}, {"y": feed + "g"}, "allgather", name))
    g.add(replace(gemm2, sublayer=name))


def _forward(g: LayerGraph, model: ModelSpec, seed: int) -> None:
    d, w, T, h, rl, act, gath = _context(g, model)
    for name, shape, sharding, local in [
            ("qkv", (T, w.qkv), "cols", (T, d.qkv_l)), ("x1", (T, h), act, (rl, h)),
            ("a", (T, w.q), "cols", (T, d.q_l)), ("zo_p", (T, h), "partial", (T, h)), ("zo", (T, h), act, (rl, h)), ("x2", (T, h), act, (rl, h)),
            ("n2", (T, h), act, (rl, h)), ("f", (T, w.fc1), "cols", (T, d.fc1_l)),
            ("g", (T, w.ffn), "cols", (T, d.ffn_l)), ("zf_p", (T, h), "partial", (T, h)), ("zf", (T, h), act, (rl, h)),
            ("x3", (T, h), act, (rl, h)), ("n1", (T, h), act, (rl, h)), ("qkv_next", (T, w.qkv), "cols", (T, d.qkv_l)),
            ("wo", (w.q, h), "rows", (d.q_l, h)), ("w1", (h, w.fc1), "cols", (h, d.fc1_l)),
            ("w2", (w.ffn, h), "rows", (d.ffn_l, h)), ("wqkv_next", (h, w.qkv), "cols", (h, d.qkv_l))]:
        g.add_tensor(name, shape, sharding, local)
    if d.sp:
        for name in ("n2g", "n1g"):
            g.add_tensor(name, (T, h), "replicated", (T, h))
    attn_in = {"qkv": "qkv"}
    if g.mode == "decode":  # the KV cache (already holding the new token's k, v)
        for name in ("kcache", "vcache"):
            g.add_tensor(name, (d.batch * model.kv * d.kv_len, d.head_dim), "heads",
                         (d.batch * d.kv_l * d.kv_len, d.head_dim))
            attn_in[name] = name
    g.add(Op("attention", "attention", attn_in, {"a": "a"}, "attention"))
    _sublayer(g, "L1", Op.gemm("out_proj", T, h, d.q_l, GemmOperands("a", "wo", "zo_p"), "fwd"), "zo",
              Op("dropout_add_ln2", "rowop", {"x": "x1", "z": "zo"}, {"x": "x2", "n": "n2"}, "residual_norm",
                 norm="ln2", seed=seed),
              "n2", Op.gemm("fc1", T, d.fc1_l, h, GemmOperands(gath("n2"), "w1", "f"), "fwd"))
    g.add(Op("activation", "activation", {"f": "f"}, {"g": "g"}, "act"))
    _sublayer(g, "L2", Op.gemm("fc2", T, h, d.ffn_l, GemmOperands("g", "w2", "zf_p"), "fwd"), "zf",
              Op("dropout_add_ln1", "rowop", {"x": "x2", "z": "zf"}, {"x": "x3", "n": "n1"}, "residual_norm",
                 norm="ln1n", seed=seed + 1),
              "n1", Op.gemm("qkv", T, d.qkv_l, h, GemmOperands(gath("n1"), "wqkv_next", "qkv_next"), "fwd"))


def _backward(g: LayerGraph, model: ModelSpec, seed: int, regather: bool) -> None:
    d, w, T, h, rl, act, gath = _context(g, model)
    for name, shape, sharding, local in [
            ("dqkv_next", (T, w.qkv), "cols", (T, d.qkv_l)), ("dx3_res", (T, h), act, (rl, h)),
            ("dn1_p", (T, h), "partial", (T, h)), ("dn1", (T, h), act, (rl, h)), ("dx3", (T, h), act, (rl, h)),
            ("dzf", (T, h), act, (rl, h)), ("dg", (T, w.ffn), "cols", (T, d.ffn_l)),
            ("df", (T, w.fc1), "cols", (T, d.fc1_l)), ("dn2_p", (T, h), "partial", (T, h)),
            ("dn2", (T, h), act, (rl, h)), ("dx2", (T, h), act, (rl, h)), ("dzo", (T, h), act, (rl, h)),
            ("da", (T, w.q), "cols", (T, d.q_l)), ("dqkv", (T, w.qkv), "cols", (T, d.qkv_l)),
            ("dwqkv_next", (h, w.qkv), "cols", (h, d.qkv_l)), ("dw2", (w.ffn, h), "rows", (d.ffn_l, h)),
            ("dw1", (h, w.fc1), "cols", (h, d.fc1_l)), ("dwo", (w.q, h), "rows", (d.q_l, h))]:
        g.add_tensor(name, shape, sharding, local)
    if d.sp:
        for name in ("dzfg", "dzog"):
            g.add_tensor(name, (T, h), "replicated", (T, h))
    _sublayer(g, "L4", Op.gemm("qkv_dgrad", T, h, d.qkv_l, GemmOperands("dqkv_next", "wqkv_next", "dn1_p", tb=True),
                               "dgrad"), "dn1",
              Op("ln1_bwd", "rowop", {"dres": "dx3_res", "dz": "dn1", "x": "x3"}, {"dx": "dx3", "dzo": "dzf"},
                 "norm_bwd", norm="ln1n", seed=seed + 1),
              "dzf", Op.gemm("fc2_dgrad", T, d.ffn_l, h, GemmOperands(gath("dzf"), "w2", "dg", tb=True), "dgrad"))
    if d.sp and regather:
        g.add(Op("regather_n1", "gather", {"x": "n1"}, {"y": "n1g"}, "allgather"))
    g.add(Op.gemm("qkv_wgrad", h, d.qkv_l, T, GemmOperands(gath("n1"), "dqkv_next", "dwqkv_next", ta=True), "wgrad"))
    g.add(Op.gemm("fc2_wgrad", d.ffn_l, h, T, GemmOperands("g", gath("dzf"), "dw2", ta=True), "wgrad"))
    g.add(Op("activation_bwd", "activation", {"dg": "dg", "f": "f"}, {"df": "df"}, "act_bwd"))
    _sublayer(g, "L3", Op.gemm("fc1_dgrad", T, h, d.fc1_l, GemmOperands("df", "w1", "dn2_p", tb=True), "dgrad"), "dn2",
              Op("ln2_bwd", "rowop", {"dres": "dx3", "dz": "dn2", "x": "x2"}, {"dx": "dx2", "dzo": "dzo"},
                 "norm_bwd", norm="ln2", seed=seed),
              "dzo", Op.gemm("out_proj_dgrad", T, d.q_l, h, GemmOperands(gath("dzo"), "wo", "da", tb=True), "dgrad"))
    if d.sp and regather:
        g.add(Op("regather_n2", "gather", {"x": "n2"}, {"y": "n2g"}, "allgather"))
    g.add(Op.gemm("fc1_wgrad", h, d.fc1_l, T, GemmOperands(gath("n2"), "df", "dw1", ta=True), "wgrad"))
    g.add(Op.gemm("out_proj_wgrad", d.q_l, h, T, GemmOperands("a", gath("dzo"), "dwo", ta=True), "wgrad"))
    g.add(Op("attention_bwd", "attention", {"da": "da", "qkv": "qkv"}, {"dqkv": "dqkv"}, "attention_bwd"))
