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

The period is derived from the layer's dataflow graph (``cais.workload.dataflow``):
each GEMM -> reduce -> row-wise op -> (gather) -> GEMM of the graph is a ``Chain``,
every other op a ``Local`` (attention, activation, weight-gradient GEMM) or a
``Gather`` (a re-gather), in the graph's program order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cais.workload.dataflow import MOE_KINDS, GemmOperands, GraphChain, LayerGraph, Op, build_graph
from cais.workload.dims import MODES, Dims, dims_for
from cais.workload.mla import MlaDims
from cais.workload.models import ModelSpec
from cais.workload.routing import Routing

__all__ = ["MODES", "Chain", "Dims", "Gather", "Gemm", "GemmOperands", "Local", "MoeStep", "Period", "Reduce", "RowOp",
           "Segment", "build_period", "dims_for", "period_of"]

# The paper's communication-intensive sub-layers (§V-A.2), each GEMM-RS -> LN -> AG-GEMM.
SUBLAYERS = {
    "L1": "forward: output projection -> reduce -> dropout+residual+LayerNorm -> gather -> first FFN GEMM",
    "L2": "forward: second FFN GEMM -> reduce -> dropout+residual+LayerNorm -> gather -> next layer's QKV",
    "L3": "backward: first FFN dgrad -> reduce -> LayerNorm bwd -> gather -> output-projection dgrad",
    "L4": "backward: QKV dgrad -> reduce -> LayerNorm bwd -> gather -> second FFN dgrad",
}
NORM_NAMES = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}


def sublayer_legend(name: str, norm: str = "layernorm") -> str:
    """The sub-layer ``name``'s line of :data:`SUBLAYERS`, naming the model's norm
    (``ModelSpec.norm``: ``layernorm`` or ``rmsnorm``); "" for a name not there."""
    return SUBLAYERS.get(name, "").replace("LayerNorm", NORM_NAMES.get(norm, norm))


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
    needs no communication (weight gradients); in a MoE period also a row-wise op
    outside a sub-layer (``kind`` ``rowop``, its ``rowop``) and, timing MLA, its
    attention and latent norms (``kind`` ``mla_attention``, ``q_a_norm``, ...: the
    period's ``mla`` gives their widths). ``side``: it runs on a
    side stream beside the main one (a MoE layer's shared experts)."""

    name: str
    kind: str  # attention, attention_bwd, act, act_bwd, gemm, rowop; MLA's (kernels/mla.py)
    gemm: Gemm | None = None
    rowop: RowOp | None = None
    side: bool = False


@dataclass(frozen=True)
class Gather:
    """An AllGather of a token-sharded activation (the backward re-gather of a
    column-parallel GEMM's input for its weight gradient)."""

    name: str
    src: str
    dst: str
    regather: bool = True  # False: a forward gather feeding the next GEMM (a MoE period's, outside a sub-layer)


@dataclass(frozen=True)
class Reduce:
    """A ReduceScatter or AllReduce of a GEMM's partial sums outside a sub-layer (a MoE
    period's backward, where no GEMM reads the row-wise op's output)."""

    name: str
    op: str  # reducescatter, allreduce
    src: str
    dst: str


@dataclass(frozen=True)
class MoeStep:
    """One step of a MoE layer's expert block (cais.workload.moe_dataflow): ``kind``
    ``route`` (top-k over the router's logits, or its backward), ``permute`` (token rows
    into or out of expert order), ``exchange`` (an EP dispatch or combine: ``kernel``),
    ``grouped_gemm`` (the experts' GEMMs; ``role`` fwd, dgrad: ``n`` x ``k`` per row;
    wgrad: ``m`` x ``n`` per expert, K its rows), ``expert_act`` (their activation) or
    ``expert_tp`` (expert TP's collective in each expert-TP group: ``kernel`` allgather
    or reducescatter of the rows its GPUs received).
    Its rows on each GPU come from the period's routing; ``side``: on a side stream."""

    name: str
    kind: str
    kernel: str
    role: str = ""
    m: int = 0
    n: int = 0
    k: int = 0
    side: bool = False


Segment = Chain | Local | Gather | Reduce | MoeStep


@dataclass
class Period:
    """One period of the layer stack: its segments in program order, and the
    buffers (name -> (rows, cols)) every GPU holds; ``graph`` is the dataflow graph
    it was derived from (``period_of``)."""

    dims: Dims
    mode: str
    segments: list[Segment]
    buffers: dict[str, tuple[int, int]] = field(default_factory=dict)
    graph: LayerGraph | None = field(default=None, compare=False, repr=False)  # what it was derived from
    routing: Routing | None = field(default=None, compare=False, repr=False)  # a MoE period's token routing
    expert_tp: int = 1  # a MoE period's expert TP (its routing is then over (expert, slot) pairs: moe_dataflow)
    # a MoE period's attention TP group (GPUs; 1: data parallel; every GPU: TP over all), its collectives within
    # each group of consecutive GPUs (moe_dataflow); None: a dense period's, TP over every GPU
    attention_tp: int | None = None
    # a MoE period's MLA widths where it times MLA's own ops (moe.mla_timing = mla; cais.workload.mla); None:
    # attention as the dense path's (MHA/GQA, MLA's stand-in)
    mla: MlaDims | None = None

    @property
    def chains(self) -> list[Chain]:
        return [s for s in self.segments if isinstance(s, Chain)]


def _gemm(op: Op) -> Gemm:
    if op.operands is None:
        raise ValueError(f"op {op.name}: a GEMM without operands")
    return Gemm(op.name, op.m, op.n, op.k, op.operands, op.role)


def _chain(graph: LayerGraph, c: GraphChain) -> Chain:
    rows, cols = graph.tensors[c.reduced].local
    ro = c.rowop
    rowop = RowOp(ro.name, ro.kernel, rows, cols, dict(ro.inputs), dict(ro.outputs), ro.norm, ro.seed)
    return Chain(c.name, _gemm(c.gemm1), c.reduced, rowop, c.feed, c.gathered, _gemm(c.gemm2))


def period_of(graph: LayerGraph) -> Period:
    """The period a scheme runs, derived from ``graph``: a ``Chain`` per
    GEMM -> reduce -> row-wise -> (gather) -> GEMM (its ops must be consecutive), a
    ``Local`` per other GEMM, attention or activation, a ``Gather`` per other gather;
    the buffers are the graph's tensors with their per-GPU shapes."""
    chains = {c.gemm1.name: c for c in graph.chains()}
    in_chain = {op.name for c in chains.values() for op in c.ops}
    segments: list[Segment] = []
    for i, op in enumerate(graph.ops):
        if op.name in chains:
            c = chains[op.name]
            if [o.name for o in graph.ops[i:i + len(c.ops)]] != [o.name for o in c.ops]:
                raise ValueError(f"chain {c.name}: its ops are not consecutive in program order")
            segments.append(_chain(graph, c))
        elif op.name in in_chain:
            continue
        elif op.kind == "gemm":
            segments.append(Local(op.name, "gemm", _gemm(op), side=op.side))
        elif op.kind in ("attention", "activation", "norm"):
            segments.append(Local(op.name, op.kernel, side=op.side))
        elif op.kind == "gather":
            segments.append(Gather(op.name, op.inputs["x"], op.outputs["y"], regather=op.role != "feed"))
        elif op.kind in MOE_KINDS:  # a MoE period's expert block (cais.workload.moe_dataflow)
            segments.append(MoeStep(op.name, op.kind, op.kernel, op.role, op.m, op.n, op.k, op.side))
        elif op.kind == "reduce" and graph.moe:
            segments.append(Reduce(op.name, op.kernel, op.inputs["x"], op.outputs["y"]))
        elif op.kind == "rowop" and graph.moe:
            rows, cols = graph.tensors[op.outputs["x" if "x" in op.outputs else "dx"]].local
            segments.append(Local(op.name, "rowop", rowop=RowOp(op.name, op.kernel, rows, cols, dict(op.inputs),
                                                                 dict(op.outputs), op.norm, op.seed)))
        else:
            raise ValueError(f"op {op.name}: a {op.kind} outside a GEMM -> reduce -> row-wise -> GEMM chain")
    buffers = {t.name: t.local for t in graph.tensors.values()}
    return Period(graph.dims, graph.mode, segments, buffers, graph)


def build_period(model: ModelSpec, n: int, mode: str, sp: bool, seed: int = 0, regather: bool = True,
                 kv_len: int | None = None) -> Period:
    """The period of ``model`` on ``n`` GPUs: ``train`` (forward + backward),
    ``prefill`` (forward) or ``decode`` (forward of one new token per sequence),
    derived from its dataflow graph (``dataflow.build_graph``)."""
    return period_of(build_graph(model, n, mode, sp, seed, regather, kv_len))
