"""Megatron-Core's all-gather token dispatcher, modelled from
NVIDIA/Megatron-LM@0014f13713bfa38a8bab4ae11edd6917d35165ce,
``megatron/core/transformer/moe/token_dispatcher.py`` (``MoEAllGatherTokenDispatcher``:
``gather_from_sequence_parallel_region`` of the hidden states over the TP x EP group,
each rank then keeping the rows of its local experts; ``token_unpermutation``:
``reduce_scatter_to_sequence_parallel_region`` of the partial outputs).

Every token goes to every rank, whatever its experts: dispatch is an AllGather of
``tokens x hidden`` per rank and combine a ReduceScatter of every rank's partial
outputs (its local experts' weighted sums, zero for tokens that did not visit them).
Both are the simulator's NCCL collectives (kernels/collectives.py), the algorithm and
protocol NCCL's choice by size (kernels/tuning.py), with NCCL's host cost. The
payload is ``dtype`` elements; FP8 scales are not sent (Megatron gathers BF16).

**Capacity ``pad``** (Megatron-Core's ``moe_pad_expert_input_to_capacity``,
NVIDIA/Megatron-LM@d98e8a64, ``moe_utils.py`` ``apply_router_token_dropping``): the
router's padded routing map travels with the gathered tokens, and each rank's local
permute picks its experts' rows, padding included, from the rows every rank has
after the AllGather. Padding is made after the exchange: rows its grouped GEMM
computes (``Routing.expert_rows``), no bytes this kernel moves.
"""

from __future__ import annotations

from cais.config import PS_PER_US, SystemConfig
from cais.hw.gpu import Kernel
from cais.kernels.collectives import CollectiveSpec, build
from cais.kernels.ep_common import EpCall, alloc_rows
from cais.kernels.tuning import Choice, choose_for
from cais.machine import Machine


#: every rank keeps the gathered rows of its own experts after the all-gather
PERMUTE = "receiver"
#: Megatron-Core's shared-expert overlap is not offered with the all-gather dispatcher
SHARED_OVERLAP = False
#: expert TP > 1 as Megatron-Core's all-gather dispatcher runs it (NVIDIA/Megatron-LM@d98e8a64,
#: ``MoEAllGatherTokenDispatcher``: its AllGather and ReduceScatter span the TP x EP group, so
#: the ReduceScatter also adds the expert-TP partial sums; cais.workload.routing.expert_tp_routing)
EXPERT_TP = "all"

#: capacity padding is picked locally from the gathered rows (module doc): ``local``
#: (cais.kernels.ep_registry)
CAPACITY_PAD = "local"

#: the NCCL collective each op is (for the event estimate, cais.experiments.estimates)
COLLECTIVES = {"dispatch": "allgather", "combine": "reducescatter"}


def collective(cfg: SystemConfig, call: EpCall) -> tuple[str, Choice, int]:
    """(op, NCCL's choice by size, nccl-tests bytes) of the NCCL collective ``call`` runs."""
    nbytes = call.routing.ranks * call.routing.tokens * call.hidden * call.elem_bytes
    op = COLLECTIVES[call.op]
    return op, choose_for(cfg, op, nbytes, "auto", "auto"), nbytes


def kernels(m: Machine, call: EpCall) -> list[Kernel]:
    """Dispatch: ``x`` ([tokens, hidden]) -> ``recv_x`` ([ranks x tokens, hidden], by
    source rank); combine: ``expert_out`` ([ranks x tokens, hidden] partial sums) ->
    ``combined`` ([tokens, hidden])."""
    rt, n, h = call.routing, m.n, call.hidden
    from cais.errors import UserError
    if rt.ranks != n:
        raise UserError(f"gpus: the routing has {rt.ranks} ranks, the system {n} GPUs")
    if call.sms is not None:
        raise UserError("sms: NCCL chooses its own channels; leave sms unset")
    for g in range(n):
        for name, rows in (("x", rt.tokens), ("recv_x", n * rt.tokens), ("expert_out", n * rt.tokens),
                           ("combined", rt.tokens)):
            alloc_rows(m, g, name, rows, call)
    count = n * rt.tokens * h
    eb = call.elem_bytes
    op, choice, _ = collective(m.cfg, call)
    send, recv = ("x", "recv_x") if call.op == "dispatch" else ("expert_out", "combined")
    spec = CollectiveSpec(op, choice.algo, count, eb, send=send, recv=recv, protocol=choice.protocol,
                          host_ps=round(m.cfg.collective.host_us * PS_PER_US))
    return build(m, spec)
