"""DeepEP's normal (high-throughput) intranode dispatch and combine, modelled from
deepseek-ai/DeepEP@dd758caf451848bd150e1046af3d0a73e5fff38d,
``csrc/kernels/legacy/intranode.cu`` (``notify_dispatch``, ``dispatch``,
``combine``), ``deep_ep/buffers/legacy.py`` (``get_dispatch_config``,
``get_combine_config``) and ``tests/legacy/test_intranode.py`` (how it is timed and
its bytes counted).

* **One copy per destination rank.** A token goes once to every rank that holds any of
  its top-k experts (``is_token_in_rank``), whatever the number of its experts there.
* **Channels.** The kernel runs on ``sms`` SMs (``Buffer.num_sms``, a knob; even):
  ``sms / 2`` channels, an even SM the channel's sender, an odd one its receiver.
  Channel ``c`` owns a contiguous range of the rank's tokens
  (``get_channel_task_range``); its sender's warps, one group per destination rank,
  copy the range's tokens bound for that rank, ``nvl_chunk`` tokens at a time, into
  the destination's per-(channel, source) queue (stores over NVLink); the
  receiver copies its queues into ``recv_x``, ordered by source rank, then channel,
  then token. Here the sender's loop is one SM port (kernels/ep_common.py) taking
  the destinations' chunks in turn; the queue's credit (``num_max_nvl_chunked_recv_tokens``,
  256) is not modelled: at EP8 with 4,096 tokens a (channel, source) queue holds
  about 225 tokens in all, so it does not fill.
* **Combine.** The rank that holds a token's experts sends one row back per token
  (the stack has summed its local experts' weighted outputs); the token's rank
  sums the rows of every rank (``combine``'s receiver).
* **Host wait.** Without a cached layout, ``notify_dispatch`` first exchanges the
  per-rank counts (a flag to every peer) and the host polls a mapped counter
  (``moe_recv_counter``) before it can size ``recv_x`` and launch the dispatch:
  ``EpConstants.host_sync_us`` plus a launch. DeepEP's tests time dispatch with the
  cached layout (``handle``), so ``host_sync`` is off in the fit.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from cais.config import PS_PER_US, SystemConfig
from cais.engine import Countdown, Signal
from cais.engine.sim import ProgramGen
from cais.errors import UserError
from cais.hw.gpu import Kernel, SmPort, TbProgram
from cais.hw.memory import Region
from cais.isa import StoreChain
from cais.kernels.common import split
from cais.kernels.ep_common import EpCall, Move, alloc_rows
from cais.machine import Machine

#: DeepEP's default NVL chunk (tokens per send round) at 8 ranks: dispatch, combine
#: (``get_dispatch_config`` / ``get_combine_config``); its tests tune it over 4..32
NVL_CHUNK = {"dispatch": 6, "combine": 4}
#: the chunk sizes tests/legacy/test_intranode.py tunes over (it reports the best)
TUNED_CHUNKS = tuple(range(4, 33, 2))


#: the received rows (one per (token, rank)) go into expert order after the dispatch
PERMUTE = "receiver"
#: the stacks that run DeepEP's normal kernels overlap the shared experts with the
#: dispatch on the SMs the kernel leaves (the reason its SM count is a knob)
SHARED_OVERLAP = True
#: expert TP > 1 as Megatron-Core's flex dispatcher runs DeepEP (NVIDIA/Megatron-LM@d98e8a64,
#: ``MoEFlexTokenDispatcher`` with ``_DeepepManager`` over the TP x EP group: the routing map
#: expanded to every expert-TP slot, top-k x TP of experts x TP; the combine adds the partial
#: sums; cais.workload.routing.expert_tp_routing)
EXPERT_TP = "all"
#: the dispatch takes BF16 rows or FP8 rows with one FP32 scale per 128 channels
#: (``Buffer.dispatch``'s ``x``: a tensor, or a tuple of the ``float8_e4m3fn`` rows and their
#: ``[tokens, hidden / 128]`` float scales), as SGLang's DeepEP dispatcher sends DeepSeek's
#: tokens; its combine takes BF16 only
DISPATCH_DTYPES = ("bf16", "fp8")

def recv_layout(call: EpCall) -> list[list[tuple[int, int]]]:
    """For each rank, its ``recv_x`` rows as (source rank, token): by source, then token
    (a channel's tokens are a contiguous range, so channel order is token order)."""
    hit = call.routing.in_rank()
    return [[(g, int(t)) for g in range(call.routing.ranks) for t in np.nonzero(hit[g, :, r])[0]]
            for r in range(call.routing.ranks)]


def sms_of(call: EpCall) -> int:
    sms = call.sms or call.consts.deepep_sms
    if sms < 2 or sms % 2:
        raise UserError(f"sms: DeepEP's normal kernels take an even SM count of at least 2, got {sms}")
    return sms


def _after(m: Machine, ps: int, sig: Signal, _value: object) -> None:
    m.sim.after(ps, sig.fire, m.sim)


def _host_ready(m: Machine, call: EpCall) -> list[list[Signal]]:
    """Per rank, what its kernel waits for before it starts: nothing, or the count
    exchange (a flag from every peer) plus the host's wait and the dispatch launch."""
    n = m.n
    if not call.host_sync or call.op != "dispatch":
        return [[] for _ in range(n)]
    key = m.flag_key() * 1_000_003
    ready = [Signal() for _ in range(n)]
    wait_ps = round(call.consts.host_sync_us * PS_PER_US) + m.launch_ps
    counts = [Countdown(n - 1) for _ in range(n)]
    for r in range(n):
        counts[r].on_fire(partial(_after, m, wait_ps, ready[r]))
        if n == 1:
            m.sim.after(wait_ps, ready[r].fire, m.sim)
    for g in range(n):
        for r in range(n):
            if r != g:
                m.isa.flag(g, r, key + g * n + r, partial(counts[r].arrive, m.sim))
    return [[s] for s in ready]


def messages(cfg: SystemConfig, call: EpCall) -> list[tuple[int, int, int, bool]]:
    """The stores one call puts on the fabric, over all GPUs, as (how many, bytes each,
    transfer unit, fenced: its write responses come back), for the event estimate
    (cais.experiments.estimates): each remote (token, rank) row in chunks of the NVL
    chunk per channel, each chunk fenced and followed by its queue tail's flag."""
    rt = call.routing
    chunk = call.chunk or NVL_CHUNK[call.op]
    mat = rt.matrix("rank")
    remote = int(mat.sum() - np.trace(mat))
    channels = sms_of(call) // 2
    # a (sender, destination) pair's rows over its channels, cut in chunks: at most one short chunk per channel
    chunks = remote // chunk + min(remote, rt.ranks * (rt.ranks - 1) * channels)
    unit = cfg.unit_for(chunk * call.row_bytes)
    return [(chunks, remote * call.row_bytes // max(1, chunks), unit, True), (chunks, 8, 8, False)]


def kernels(m: Machine, call: EpCall) -> list[Kernel]:
    """One DeepEP normal kernel per GPU for ``call`` (module doc). Buffers: dispatch
    reads ``x`` ([tokens, hidden]) and fills ``recv_x`` (:func:`recv_layout`); combine
    reads ``expert_out`` (``recv_x``'s layout) and fills ``combined`` ([tokens, hidden])."""
    rt, n, T = call.routing, m.n, call.routing.tokens
    if rt.ranks != n:
        raise UserError(f"gpus: the routing has {rt.ranks} ranks, the system {n} GPUs")
    sms = sms_of(call)
    C = sms // 2
    chunk = call.chunk or NVL_CHUNK[call.op]
    ranges = split(0, T, C)
    hit = rt.in_rank()
    # toks[g][r]: the tokens of rank g bound for rank r, in order; rank r's recv_x holds them
    # from row first[g, r] on (by source, then token: recv_layout)
    toks = [[np.flatnonzero(hit[g, :, r]) for r in range(n)] for g in range(n)]
    sizes = np.array([[len(toks[g][r]) for r in range(n)] for g in range(n)], dtype=np.int64)
    first = np.cumsum(sizes, axis=0) - sizes
    ready = _host_ready(m, call)
    # landed[r][c]: the moves into rank r's channel-c receiver
    moves: list[list[list[Move]]] = [[[] for _ in range(C)] for _ in range(n)]  # [sender gpu][channel]
    into: list[list[int]] = [[0] * C for _ in range(n)]
    for g in range(n):
        alloc_rows(m, g, "x", T, call)
        alloc_rows(m, g, "recv_x", int(sizes[:, g].sum()), call)
        alloc_rows(m, g, "expert_out", int(sizes[:, g].sum()), call)
        alloc_rows(m, g, "combined", T, call)
        alloc_rows(m, g, "comb_ring", n * T, call)
    for c, (t0, tc) in enumerate(ranges):
        for src in range(n):
            for dst in range(n):
                # dispatch: src's tokens bound for dst; combine: rank src holds rows of dst's tokens,
                # back into dst's ring
                g, r = (src, dst) if call.op == "dispatch" else (dst, src)
                every = toks[g][r]
                lo, hi = np.searchsorted(every, (t0, t0 + tc))
                part_toks = every[lo:hi].tolist()
                for a in range(0, len(part_toks), chunk):
                    part = part_toks[a:a + chunk]
                    at = int(first[g, r]) + int(lo) + a  # recv_x row of the part's first token on r
                    if call.op == "dispatch":
                        moves[src][c].append(Move(src, dst, "x", part, "recv_x", at))
                    else:
                        moves[src][c].append(Move(src, dst, "expert_out", range(at, at + len(part)), "comb_ring",
                                                  src * T + t0 + a))
                    into[dst][c] += 1
    arrive = [[Countdown(into[r][c]) for c in range(C)] for r in range(n)]
    for g in range(n):
        for c in range(C):  # the destinations' chunks in turn (one warp group per rank)
            turn: dict[int, int] = {}
            keyed = []
            for mv in moves[g][c]:
                k = turn.get(mv.dst, 0)
                turn[mv.dst] = k + 1
                keyed.append(((k, (mv.dst - g) % n), mv))
            keyed.sort(key=lambda kv: kv[0])
            moves[g][c] = [mv for _, mv in keyed]
            for mv in moves[g][c]:
                mv.landed.append(arrive[mv.dst][c])
    out = []
    for g in range(n):
        tbs: list[TbProgram | None] = []
        for c, (t0, tc) in enumerate(ranges):
            tbs.append(_sender(m, g, call, moves[g][c], ready[g]))
            tbs.append(_receiver(m, g, call, arrive[g][c], ready[g], t0, tc, hit))
        out.append(Kernel(f"deepep-{call.op}", tbs, None, role="communication"))
    return out


def _sender(m: Machine, g: int, call: EpCall, moves: list[Move], ready: list[Signal],
            compiled_loop: bool = True) -> TbProgram:
    """A channel's sender on GPU ``g``: one stream per destination rank (its warp
    group), all on the SM's one copy port; a stream copies a chunk, waits for its
    stores to be acknowledged and stores the queue's tail on the destination
    (``st_release_sys_global``: a release at system scope), then takes its next chunk.
    In timing mode the loop runs in the core (:class:`cais._core.StoreChains`), unless
    ``compiled_loop`` is off (the same loop in Python, which functional mode runs to
    carry the rows)."""
    isa, sim = m.isa, m.sim
    mem = m.gpus[g].memory
    h, eb, se = call.hidden, call.elem_bytes, call.scale_elems
    streams: dict[int, list[Move]] = {}
    for mv in moves:
        if mv.rows:
            streams.setdefault(mv.dst, []).append(mv)
    rb = call.row_bytes
    unit = m.cfg.unit_for(max([len(mv.rows) * rb for mv in moves] or [rb]))
    key = m.flag_key() * 1_000_003

    def rows_of(mv: Move, buf: str, width: int) -> np.ndarray | None:
        if not mem.functional:
            return None
        return mem.buffers[buf].reshape(-1, width)[np.asarray(mv.rows, dtype=np.int64)].reshape(-1)

    order = sorted(streams, key=lambda d: (d - g) % m.n)

    def compiled(port: SmPort) -> Signal:
        """The streams' loop in the core (timing mode: no rows' data to carry)."""
        chains: list[StoreChain] = []
        for dst in order:
            chunks = []
            for mv in streams[dst]:
                nr = len(mv.rows)
                parts = []
                if dst != g:
                    parts.append(isa.stripes(Region(mv.dst_buf, mv.dst_row * h, nr * h, eb), unit))
                    if se:
                        parts.append(isa.stripes(Region(f"{mv.dst_buf}.scales", mv.dst_row * se, nr * se, 4), unit))
                chunks.append((parts, nr * rb, mv.landed))
            chains.append((dst, isa.flag_wire(g, dst, key + dst), chunks))
        return isa.store_chains(g, chains, port)

    def program(sm: int, busy: int) -> ProgramGen:
        for sig in ready:
            yield sig
        port = isa.sm_port(call.consts.sm_copy_GBps)
        if not mem.functional and compiled_loop:
            if streams:
                yield compiled(port)
            return
        done = Countdown(len(streams))

        def step(dst: int, i: int) -> None:
            chain = streams[dst]
            if i == len(chain):
                done.arrive(sim)
                return
            mv = chain[i]
            nr = len(mv.rows)
            parts = [(Region(mv.dst_buf, mv.dst_row * h, nr * h, eb), rows_of(mv, mv.src_buf, h))]
            if se:
                parts.append((Region(f"{mv.dst_buf}.scales", mv.dst_row * se, nr * se, 4),
                              rows_of(mv, f"{mv.src_buf}.scales", se)))

            def tail_seen() -> None:
                for c in mv.landed:
                    c.arrive(sim)

            if dst == g:  # its own queue: the copy's time, then the tail
                def local() -> None:
                    for region, data in parts:
                        mem.write(region, data)
                    tail_seen()
                    step(dst, i + 1)
                _, end = port.push(sim.now, nr * rb)  # the SM's copy port, as a peer's chunk
                sim.after(max(0, end - sim.now), local)
                return
            def release(_v: object = None) -> None:
                isa.flag(g, dst, key + dst, tail_seen)  # the tail, after the chunk's acks
                step(dst, i + 1)
            fenced: Callable[[], None] = release  # one part: its acks are the chunk's
            if len(parts) > 1:
                acked = Countdown(len(parts))
                acked.on_fire(release)
                fenced = partial(acked.arrive, sim)
            for region, data in parts:
                isa.st(g, dst, region, data, None, port, 0, unit, fenced=fenced)

        for dst in order:
            step(dst, 0)
        if streams:
            yield done
    return program


def _receiver(m: Machine, g: int, call: EpCall, arrived: Countdown, ready: list[Signal], t0: int, tc: int,
              hit: np.ndarray) -> TbProgram:
    """A channel's receiver on GPU ``g``: waits for its queues to fill (dispatch: the
    rows are in ``recv_x``); combine: sums each token's rows from every rank."""
    mem = m.gpus[g].memory
    n, T, h = m.n, call.routing.tokens, call.hidden

    def program(sm: int, busy: int) -> ProgramGen:
        for sig in ready:
            yield sig
        if arrived.remaining:
            yield arrived
        if call.op == "combine" and mem.functional:
            ring = mem.buffers["comb_ring"].reshape(-1, h)
            out = mem.buffers["combined"].reshape(-1, h)
            for r in range(n):
                # the ring of rank r holds the channel's tokens routed to r, in token order
                toks = [t for t in range(t0, t0 + tc) if hit[g, t, r]]
                for j, t in enumerate(toks):
                    out[t] += ring[r * T + t0 + j]
    return program
