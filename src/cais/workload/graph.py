"""Layer graphs: one repeating period of a Megatron tensor-parallel transformer stack,
per GPU, as a list of segments a scheme executes.

A layer stack repeats, so we simulate a *period* that starts at attention and
contains every op of a layer once (docs/layer-semantics.md). Forward:

    attention -> [L1: out-proj -> RS -> dropout+residual -> LN2 -> AG -> FC1]
              -> activation -> [L2: FC2 -> RS -> dropout+residual -> LN1' -> AG -> QKV']

Backward (the conjugates):

    [L4: QKV' dgrad -> RS -> LN1' bwd -> dropout bwd -> AG -> FC2 dgrad] + wgrads
    -> activation bwd -> [L3: FC1 dgrad -> RS -> LN2 bwd -> dropout bwd -> AG -> out-proj dgrad]
    + wgrads -> attention bwd

With sequence parallelism (``sp=True``) activations between the GEMMs are sharded
by token rows and the reductions are ReduceScatter + AllGather; basic TP replaces
them by one AllReduce and computes the row-wise ops redundantly on every GPU.
Buffers are named per GPU (see ``PeriodBuffers``); each is a row-major matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cais.workload.models import ModelSpec

MODES = ("train", "prefill", "decode")


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
class Dims:
    """Per-GPU shapes of one period for TP degree ``n``."""

    n: int
    tokens: int  # rows of the activations (tokens; in decode, one per sequence)
    batch: int
    seq: int  # query positions per sequence (1 in decode)
    kv_len: int  # keys per sequence (the KV cache length in decode)
    hidden: int
    heads_l: int
    kv_l: int
    head_dim: int
    ffn_l: int
    gated: bool
    sp: bool

    @property
    def rows_l(self) -> int:
        """Rows of the row-wise ops on one GPU: a token shard with SP, all without."""
        return self.tokens // self.n if self.sp else self.tokens

    @property
    def q_l(self) -> int:
        return self.heads_l * self.head_dim

    @property
    def qkv_l(self) -> int:
        return (self.heads_l + 2 * self.kv_l) * self.head_dim

    @property
    def fc1_l(self) -> int:
        return 2 * self.ffn_l if self.gated else self.ffn_l


def dims_for(model: ModelSpec, n: int, mode: str, sp: bool, kv_len: int | None = None) -> Dims:
    model.check_tp(n)
    kv_l = model.kv // n if model.kv >= n else 1
    if mode == "decode":
        tokens, seq, kvl = model.batch, 1, kv_len or model.seq
    else:
        tokens, seq, kvl = model.tokens, model.seq, model.seq
    if sp and tokens % n:
        raise ValueError(f"--mode {mode}: {tokens} token rows do not split over {n} GPUs; use a batch that does")
    return Dims(n, tokens, model.batch, seq, kvl, model.hidden, model.heads // n, kv_l, model.dim,
                model.ffn_hidden // n, model.gated_mlp, sp)


@dataclass(frozen=True)
class Gemm:
    """One GEMM of the period on every GPU: C[m,n] = op(A) @ op(B)."""

    name: str
    m: int
    n: int
    k: int
    ops: GemmOperands
    role: str  # fwd, dgrad, wgrad


@dataclass(frozen=True)
class RowOp:
    """A row-wise kernel over ``rows`` rows of width ``cols``: ``kind`` is
    ``residual_norm`` (x_out = x_in + dropout(z); n = norm(x_out)) or
    ``norm_bwd`` (dx = dres + norm_bwd(dz, x); dzo = dropout_bwd(dx))."""

    name: str
    kind: str
    rows: int
    cols: int
    inputs: dict[str, str]
    outputs: dict[str, str]
    norm: str  # prefix of the norm weights: "ln2" (this layer), "ln1n" (the next layer LN1)
    seed: int


@dataclass(frozen=True)
class Chain:
    """A paper sub-layer: GEMM producing partial sums -> reduction (RS or AR) ->
    row-wise op -> (AG) -> GEMM(s) consuming the gathered rows."""

    name: str
    gemm1: Gemm
    reduced: str  # RS output [rows_l, h] (SP) or AR output [T, h]
    rowop: RowOp
    gather_src: str  # row-wise output the second GEMM needs ([rows_l, h])
    gather_dst: str  # its gathered form [T, h] (== gather_src without SP)
    gemm2: Gemm


@dataclass(frozen=True)
class Local:
    """A GPU-local kernel: attention, activation, their backwards, or a GEMM that
    needs no communication (weight gradients)."""

    name: str
    kind: str  # attention, attention_bwd, act, act_bwd, gemm
    gemm: Gemm | None = None


@dataclass(frozen=True)
class Gather:
    """An AllGather of a token-sharded activation (the backward re-gather of a
    column-parallel GEMM's input for its weight gradient)."""

    name: str
    src: str
    dst: str


Segment = Chain | Local | Gather


@dataclass
class Period:
    """One period of the layer stack: its segments in program order, and the
    buffers (name -> (rows, cols)) every GPU holds."""

    dims: Dims
    mode: str
    segments: list[Segment]
    buffers: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def chains(self) -> list[Chain]:
        return [s for s in self.segments if isinstance(s, Chain)]


def _forward(d: Dims, p: Period, seed: int) -> None:
    T, h, rl = d.tokens, d.hidden, d.rows_l
    gath = (lambda s: s + "g") if d.sp else (lambda s: s)
    p.buffers.update({"qkv": (T, d.qkv_l), "x1": (rl, h), "a": (T, d.q_l), "zo_p": (T, h), "zo": (rl, h),
                      "x2": (rl, h), "n2": (rl, h), "f": (T, d.fc1_l), "g": (T, d.ffn_l), "zf_p": (T, h),
                      "zf": (rl, h), "x3": (rl, h), "n1": (rl, h), "qkv_next": (T, d.qkv_l),
                      "wo": (d.q_l, h), "w1": (h, d.fc1_l), "w2": (d.ffn_l, h), "wqkv_next": (h, d.qkv_l)})
    if d.sp:
        p.buffers.update({"n2g": (T, h), "n1g": (T, h)})
    if p.mode == "decode":  # the KV cache (already holding the new token's k, v)
        p.buffers.update({"kcache": (d.batch * d.kv_l * d.kv_len, d.head_dim),
                          "vcache": (d.batch * d.kv_l * d.kv_len, d.head_dim)})
    p.segments.append(Local("attention", "attention"))
    p.segments.append(Chain(
        "L1", Gemm("out_proj", T, h, d.q_l, GemmOperands("a", "wo", "zo_p"), "fwd"), "zo",
        RowOp("dropout_add_ln2", "residual_norm", rl, h, {"x": "x1", "z": "zo"}, {"x": "x2", "n": "n2"}, "ln2", seed),
        "n2", gath("n2"), Gemm("fc1", T, d.fc1_l, h, GemmOperands(gath("n2"), "w1", "f"), "fwd")))
    p.segments.append(Local("activation", "act"))
    p.segments.append(Chain(
        "L2", Gemm("fc2", T, h, d.ffn_l, GemmOperands("g", "w2", "zf_p"), "fwd"), "zf",
        RowOp("dropout_add_ln1", "residual_norm", rl, h, {"x": "x2", "z": "zf"}, {"x": "x3", "n": "n1"}, "ln1n",
              seed + 1),
        "n1", gath("n1"), Gemm("qkv", T, d.qkv_l, h, GemmOperands(gath("n1"), "wqkv_next", "qkv_next"), "fwd")))


def _backward(d: Dims, p: Period, seed: int, regather: bool) -> None:
    T, h, rl = d.tokens, d.hidden, d.rows_l
    gath = (lambda s: s + "g") if d.sp else (lambda s: s)
    p.buffers.update({"dqkv_next": (T, d.qkv_l), "dx3_res": (rl, h), "dn1_p": (T, h), "dn1": (rl, h),
                      "dx3": (rl, h), "dzf": (rl, h), "dg": (T, d.ffn_l), "df": (T, d.fc1_l), "dn2_p": (T, h),
                      "dn2": (rl, h), "dx2": (rl, h), "dzo": (rl, h), "da": (T, d.q_l), "dqkv": (T, d.qkv_l),
                      "dwqkv_next": (h, d.qkv_l), "dw2": (d.ffn_l, h), "dw1": (h, d.fc1_l), "dwo": (d.q_l, h)})
    if d.sp:
        p.buffers.update({"dzfg": (T, h), "dzog": (T, h), "n2g": (T, h), "n1g": (T, h)})
    p.segments.append(Chain(
        "L4", Gemm("qkv_dgrad", T, h, d.qkv_l, GemmOperands("dqkv_next", "wqkv_next", "dn1_p", tb=True), "dgrad"),
        "dn1",
        RowOp("ln1_bwd", "norm_bwd", rl, h, {"dres": "dx3_res", "dz": "dn1", "x": "x3"}, {"dx": "dx3", "dzo": "dzf"},
              "ln1n", seed + 1),
        "dzf", gath("dzf"), Gemm("fc2_dgrad", T, d.ffn_l, h, GemmOperands(gath("dzf"), "w2", "dg", tb=True), "dgrad")))
    if d.sp and regather:
        p.segments.append(Gather("regather_n1", "n1", "n1g"))
    p.segments.append(Local("qkv_wgrad", "gemm", Gemm("qkv_wgrad", h, d.qkv_l, T,
                                                      GemmOperands(gath("n1"), "dqkv_next", "dwqkv_next", ta=True),
                                                      "wgrad")))
    p.segments.append(Local("fc2_wgrad", "gemm", Gemm("fc2_wgrad", d.ffn_l, h, T,
                                                      GemmOperands("g", gath("dzf"), "dw2", ta=True), "wgrad")))
    p.segments.append(Local("activation_bwd", "act_bwd"))
    p.segments.append(Chain(
        "L3", Gemm("fc1_dgrad", T, h, d.fc1_l, GemmOperands("df", "w1", "dn2_p", tb=True), "dgrad"), "dn2",
        RowOp("ln2_bwd", "norm_bwd", rl, h, {"dres": "dx3", "dz": "dn2", "x": "x2"}, {"dx": "dx2", "dzo": "dzo"},
              "ln2", seed),
        "dzo", gath("dzo"), Gemm("out_proj_dgrad", T, d.q_l, h, GemmOperands(gath("dzo"), "wo", "da", tb=True),
                                 "dgrad")))
    if d.sp and regather:
        p.segments.append(Gather("regather_n2", "n2", "n2g"))
    p.segments.append(Local("fc1_wgrad", "gemm", Gemm("fc1_wgrad", h, d.fc1_l, T,
                                                      GemmOperands(gath("n2"), "df", "dw1", ta=True), "wgrad")))
    p.segments.append(Local("out_proj_wgrad", "gemm", Gemm("out_proj_wgrad", d.q_l, h, T,
                                                           GemmOperands("a", gath("dzo"), "dwo", ta=True), "wgrad")))
    p.segments.append(Local("attention_bwd", "attention_bwd"))


def build_period(model: ModelSpec, n: int, mode: str, sp: bool, seed: int = 0, regather: bool = True,
                 kv_len: int | None = None) -> Period:
    """The period of ``model`` on ``n`` GPUs: ``train`` (forward + backward),
    ``prefill`` (forward) or ``decode`` (forward of one new token per sequence)."""
    if mode not in MODES:
        raise ValueError(f"--mode: unknown mode '{mode}'; valid: {', '.join(MODES)}")
    d = dims_for(model, n, mode, sp, kv_len)
    p = Period(d, mode, [])
    _forward(d, p, seed)
    if mode == "train":
        _backward(d, p, seed, regather)
    return p
