"""TP-vLLM, TP-SGLang, TP-TRTLLM: basic tensor parallelism with the all-reduce each
production inference stack runs, kernel for kernel, at every size and GPU count.

Mechanism: as ``tp-nvls`` (every GEMM whole on all SMs, nothing overlaps, the
row-wise ops replicated on all T token rows), but each sub-layer's all-reduce and
the residual add + RMSNorm after it run as the stack's own table says
(kernels/stacks.py, with the sources and commits): the kernels of the op in order,
copies into and out of registered buffers as kernels of their own, the norm fused
into the all-reduce kernel where the stack fuses it, NCCL (its own algorithm and
protocol by size, tp-nccl's run) where the stack hands the call to NCCL. The
building blocks are the single-kernel schemes' kernels (kernels/production_ar.py:
``tp-custom-ar``, ``tp-multimem``, ``tp-fused-ar-norm``).

What costs time besides the data movement: each copy a memory-bound kernel
(calibrated HBM time), the Lamport buffer clear of a fused one-shot and the input
copy of a fused two-shot inside the kernel, the kernels' release/acquire barriers
at system scope (``collective.fence_us``) and the fused kernels' fixed time
(``collective.fused_fixed_us``; both calibrated, docs/validation.md), and the launches (``gpu.launch``: in eager every op costs the host ``host_op_us`` and
each further kernel ``host_launch_us``; a kernel launched with PDL waits
``pdl_gap_us`` instead of ``kernel_gap_us``). docs/schemes/tp-stacks.md."""

from __future__ import annotations

from cais.kernels import production_ar as pa
from cais.kernels import stacks as st
from cais.schemes.base import NCCL_CHOICE, Deps, LayerRun, Scheme
from cais.schemes.tp_fused_ar_norm import fused_rowop
from cais.workload.graph import Chain

PS_PER_US = 1_000_000


class TpStack(Scheme):
    """Basic TP, bulk synchronous; the all-reduce (+ norm) as a production stack runs it."""

    modes = ("prefill", "decode")
    modes_why = "an inference stack's all-reduce, which no training framework runs (tp-nccl is Megatron's)"

    sp = False
    family = "production"
    algo = NCCL_CHOICE  # where the stack calls NCCL: NCCL's own algorithm and protocol by size
    stack = ""

    def plan(self, r: LayerRun, c: Chain | None) -> st.Plan:
        """The stack's plan for this period's all-reduce (``c``: the sub-layer, whose
        row-wise op decides whether the norm may fuse; None: a bare all-reduce)."""
        raise NotImplementedError(f"{type(self).__name__}: each stack's scheme (tp-vllm, tp-sglang, tp-trtllm) "
                                  "gives its own plan")

    def fusable(self, r: LayerRun, c: Chain | None) -> bool:
        """The all-reduce feeds a residual add + RMSNorm (what the fusions match)."""
        return (c is not None and not r.d.sp and c.rowop.kind == "residual_norm"
                and r.model.norm == "rmsnorm" and c.gemm1.role == "fwd")

    def hands_to_nccl(self, n: int, nbytes: int) -> bool:  # never shares tp-nccl's run: its chain is its own
        return False

    # ---- the op -------------------------------------------------------------------
    def _spec(self, r: LayerRun, step: st.Step, src: str, dst: str, count: int, rowop=None) -> pa.ProductionAr:
        """The production kernel of ``step`` over ``count`` elements."""
        n, eb, h = r.m.n, r.model.dtype_bytes, r.d.hidden
        nbytes = count * eb
        if step.kind == "custom":
            return pa.ProductionAr("custom", step.path, count, eb, src, dst, pa.custom_blocks(nbytes))
        if step.kind == "multimem":
            return pa.ProductionAr("multimem", "twoshot", count, eb, src, dst, pa.multimem_blocks(nbytes, n))
        if step.kind == "push":  # SGLang's one-shot push: the Lamport one-shot's movement, 16-byte rows
            row = max(1, pa.PACKET // eb)
            return pa.ProductionAr("fused", "oneshot", count, eb, src, dst, pa.custom_blocks(nbytes), row_elems=row,
                                   label="push")
        assert step.kind == "fused"
        tokens = count // h
        oneshot = step.path == "oneshot"
        blocks = pa.fused_grid(tokens, h, n, r.sms, eb, oneshot)
        # one-shot: clear an earlier call's Lamport slots (n copies, written); two-shot: copy the input in
        clear = round(n * nbytes / r.m.cfg.gpu.hbm_bandwidth_GBps * 1000) if oneshot else 0
        copy = 0 if oneshot else pa.copy_time_ps(r.m, nbytes)
        return pa.ProductionAr("fused", step.path, count, eb, src, dst, blocks, copy_ps=copy, row_elems=h,
                               rowop=rowop, clear_ps=clear)

    def run_plan(self, r: LayerRun, plan: st.Plan, src: str, dst: str, deps: Deps, segment: str,
                 rowop=None, count: int | None = None) -> Deps:
        """The plan's kernels after ``deps``: one op, its first kernel the host's op,
        the others further launches of it; ``count`` elements (default: the layer's
        token rows)."""
        n = r.m.n
        count = r.d.tokens * r.d.hidden if count is None else count
        nbytes = count * r.model.dtype_bytes
        mem_over = r.cm_mem_overhead_ps
        first = True
        for step in plan.steps:
            host = "op" if first else "launch"
            first = False
            if step.kind == "nccl":
                deps = self.collective_step(r, "allreduce", src, dst, deps, segment)
                continue
            if step.kind == "copy":
                copies = [r.copy_kernel(g, nbytes, f"{self.stack} copy") for g in range(n)]
                for k in copies:
                    k.role = "communication"  # part of the all-reduce op
                deps = [r.submit(g, k, [deps[g]], mem_over, segment, host=host) for g, k in enumerate(copies)]
                continue
            kernels = r.production_allreduce(self._spec(r, step, src, dst, count, rowop))
            for k in kernels:
                k.name = f"{self.stack} {k.name}"
            deps = [r.submit(g, k, [deps[g]], r.m.launch_ps, segment, host=host, pdl=step.pdl)
                    for g, k in enumerate(kernels)]
        return deps

    def allreduce(self, r: LayerRun, src: str, dst: str, deps: Deps, segment: str) -> Deps:
        return self.run_plan(r, self.plan(r, None), src, dst, deps, segment)

    def chain(self, r: LayerRun, c: Chain, deps: Deps) -> Deps:
        """GEMM -> the stack's all-reduce (+ the norm where it fuses) -> GEMM."""
        if r.d.sp:
            return super().chain(r, c, deps)
        plan = self.plan(r, c)
        if not plan.fused:
            n, over = r.m.n, r.cm.kernel_overhead_ps
            g1 = [r.submit(g, r.gemm_kernel(g, c.gemm1), [deps[g]], over, c.name) for g in range(n)]
            red = self.run_plan(r, plan, c.gemm1.ops.c, c.reduced, g1, c.name)
            rows = [r.submit(g, r.rowop_kernel(g, c.rowop), [red[g]], r.cm_mem_overhead_ps, c.name)
                    for g in range(n)]
            return [r.submit(g, r.gemm_kernel(g, c.gemm2), [rows[g]], over, c.name) for g in range(n)]
        n, over = r.m.n, r.cm.kernel_overhead_ps
        step = plan.steps[0]
        blocks = pa.fused_grid(r.d.tokens, r.d.hidden, n, r.sms, r.model.dtype_bytes, step.path == "oneshot")
        rowop = fused_rowop(r, c, r.rowop_work_ps(c.rowop, c.rowop.rows, blocks))

        g1 = [r.submit(g, r.gemm_kernel(g, c.gemm1), [deps[g]], over, c.name) for g in range(n)]
        fused = self.run_plan(r, plan, c.gemm1.ops.c, c.reduced, g1, c.name, rowop)
        return [r.submit(g, r.gemm_kernel(g, c.gemm2), [fused[g]], over, c.name) for g in range(n)]


class TpVllm(TpStack):
    """vLLM (torch symmetric memory on): fused AR + RMSNorm, custom, multimem, NCCL by size."""

    name = "tp-vllm"
    stack = "vllm"
    summary = ("basic TP: GEMM -> vLLM's all-reduce by size (fused AR+RMSNorm / custom / copy+multimem+copy / NCCL) "
               "-> GEMM")

    def plan(self, r: LayerRun, c: Chain | None) -> st.Plan:
        nbytes = r.d.tokens * r.d.hidden * r.model.dtype_bytes
        return st.vllm_plan(r.m.n, nbytes, r.launch_mode, self.fusable(r, c))


class TpSglang(TpStack):
    """SGLang (custom all-reduce v2): one-shot push, two-shot pull on NVLS, NCCL above 16 MiB."""

    name = "tp-sglang"
    stack = "sglang"
    summary = "basic TP: GEMM -> SGLang all-reduce v2 by size (push one-shot / NVLS two-shot / NCCL) -> RMSNorm -> GEMM"

    def plan(self, r: LayerRun, c: Chain | None) -> st.Plan:
        nbytes = r.d.tokens * r.d.hidden * r.model.dtype_bytes
        return st.sglang_plan(r.m.n, nbytes, r.launch_mode)


class TpTrtllm(TpStack):
    """TensorRT-LLM (AUTO, RESIDUAL_RMS_NORM): fused one-/two-shot by its SM90 table, else NCCL."""

    name = "tp-trtllm"
    stack = "trtllm"
    summary = "basic TP: GEMM -> TensorRT-LLM AUTO all-reduce (fused AR+RMSNorm by its table, else NCCL) -> GEMM"

    def plan(self, r: LayerRun, c: Chain | None) -> st.Plan:
        return st.trtllm_plan(r.m.n, r.d.tokens, r.d.hidden, r.model.dtype_bytes, self.fusable(r, c))
