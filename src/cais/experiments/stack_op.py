"""A production stack's all-reduce op run back to back, as the stacks' own
microbenchmarks time it: ``calls`` ops in a row on one machine, each after the
previous one on every GPU, under the system's launch mode (``gpu.launch``: eager, the
host issues every op; graph, a CUDA-graph replay). The per-call time is the steady
state (the last calls' spacing), which is what a loop of back-to-back calls divided by
its count measures once its first call is amortised.

The op is a :class:`cais.kernels.stacks.Plan` run by the schemes' own code
(:meth:`cais.schemes.tp_stacks.TpStack.run_plan`): the same kernels, copies, fences,
gaps and host issue a ``tp-vllm`` / ``tp-sglang`` / ``tp-trtllm`` layer run has. A fused
plan applies the residual add + RMSNorm of a layer's first sub-layer to the reduced
rows. Used by scripts/validate_production.py and scripts/fit_production.py."""

from __future__ import annotations

from dataclasses import dataclass

from cais.config import PS_PER_US, SystemConfig
from cais.engine import Signal
from cais.errors import UserError
from cais.kernels import production_ar as pa
from cais.kernels.stacks import Plan
from cais.machine import Machine
from cais.schemes.base import LayerRun
from cais.schemes.tp_fused_ar_norm import fused_rowop
from cais.schemes.tp_stacks import TpStack
from cais.hw.compute import ComputeModel
from cais.workload.graph import build_period
from cais.workload.models import ModelSpec

#: the token width a one-dimensional buffer (a ``(size,)`` tensor) is cut into
FLAT_HIDDEN = 4096


@dataclass(frozen=True)
class OpLoop:
    """Back-to-back calls of one all-reduce op: each call's end (us, the last GPU's)
    and the steady-state time per call."""

    ends_us: tuple[float, ...]

    @property
    def per_call_us(self) -> float:
        """The spacing of the calls after the first two (the loop's steady state)."""
        e = self.ends_us
        return (e[-1] - e[1]) / (len(e) - 2)


class _Probe(TpStack):
    """The stack machinery with no table of its own: the caller hands it the plan."""

    name = "stack-op-probe"
    stack = "probe"


def probe_model(n: int, tokens: int, hidden: int, elem_bytes: int) -> ModelSpec:
    """A one-layer RMSNorm model whose first sub-layer's all-reduce is ``tokens`` x
    ``hidden`` elements of ``elem_bytes`` on ``n`` GPUs (its other widths only need to
    be valid)."""
    heads = max(n, hidden // 128)
    heads -= heads % n
    return ModelSpec(name=f"ar-probe-{tokens}x{hidden}", family="llama", hidden=hidden, ffn_hidden=n * 128,
                     heads=heads, head_dim=128, layers=1, gated_mlp=True, norm="rmsnorm",
                     activation="swiglu", seq=tokens, batch=1, dtype_bytes=elem_bytes)


def shape_of(nbytes: int, elem_bytes: int, hidden: int | None) -> tuple[int, int]:
    """(tokens, hidden) of a buffer: the source's token width where it has one, else
    :data:`FLAT_HIDDEN` (or the whole buffer, if smaller)."""
    count = nbytes // elem_bytes
    if count * elem_bytes != nbytes:
        raise UserError(f"bytes: {nbytes} is not a whole number of {elem_bytes}-byte elements")
    h = hidden or min(count, FLAT_HIDDEN)
    if count % h:
        raise UserError(f"bytes: {count} elements are not whole tokens of hidden {h}")
    return count // h, h


def op_loop(cfg: SystemConfig, plan: Plan, nbytes: int, elem_bytes: int = 2, hidden: int | None = None,
            calls: int = 6) -> OpLoop:
    """Run ``calls`` back-to-back all-reduce ops of ``plan`` over ``nbytes`` on
    ``cfg`` (its ``gpu.launch`` mode) and return when each ended."""
    if calls < 3:
        raise UserError(f"calls: {calls}; at least 3 (the steady state skips the first)")
    n = cfg.gpus
    tokens, h = shape_of(nbytes, elem_bytes, hidden)
    model = probe_model(n, tokens, h, elem_bytes)
    period = build_period(model, n, "prefill", sp=False)
    chain = next(c for c in period.chains if c.rowop.kind == "residual_norm" and c.gemm1.role == "fwd")
    m = Machine(cfg)
    run = LayerRun(m, model, period, ComputeModel.for_gpu(cfg.gpu))
    scheme = _Probe()
    rowop = None
    if plan.fused:
        oneshot = plan.steps[0].path == "oneshot"
        blocks = pa.fused_grid(tokens, h, n, cfg.gpu.sms, elem_bytes, oneshot)
        rowop = fused_rowop(run, chain, run.rowop_work_ps(chain.rowop, tokens, blocks))
    ready: list[Signal] = []
    for _ in range(n):
        s = Signal()
        s.fire(m.sim)
        ready.append(s)
    ops = []
    deps = ready
    for i in range(calls):
        deps = scheme.run_plan(run, plan, chain.gemm1.ops.c, chain.reduced, deps, f"call {i}", rowop,
                               count=tokens * h)
        ops.append(deps)
    m.run()
    ends = []
    for i, op in enumerate(ops):
        times = [s.time for s in op]
        if any(t is None for t in times):
            raise RuntimeError(f"stack op call {i} never finished")
        ends.append(max(t for t in times if t is not None) / PS_PER_US)
    return OpLoop(tuple(ends))
