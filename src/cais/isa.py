"""The memory instructions thread blocks issue, with their timing and their data.

Point-to-point (unicast, to a peer GPU's memory through a switch chip):
  ``ld``   read a region of a home GPU's memory (request up, data back);
  ``st``   posted write into a peer's memory;
  ``red``  posted add-reduction into a peer's memory.
CAIS (paper §III-A.1: ordinary addresses of the home GPU, with the mergeable bit set):
  ``ld_cais``   a load the switch may merge with other GPUs' loads of the address;
  ``red_cais``  a reduction the switch may sum with other GPUs' reductions first;
  ``group_sync``  a TB's registration with its TB group (merging-aware coordination).
CAIS-EP (docs/moe.md, "In-switch expert parallelism"):
  ``st_mc_dyn``   a store to a dynamic multimem address: the switch copies it to the
                  members of the group its address names (hw/ep_switch.py);
  ``red_cais`` with ``expect``  the combine's reduction (``red.cais.dyn``): the
                  contributor count of the access travels with it.
NVLS (multimem addresses: the same buffer on every GPU, bound to a multicast object):
  ``multimem_st``         the switch multicasts the store to every replica;
  ``multimem_ld_reduce``  the switch reads every replica, sums, returns the sum;
  ``multimem_red``        the switch adds the operand into every replica.
Synchronisation (8 B flags, as NCCL's kernels use them):
  ``flag``                store a flag on a peer (ring slot flags and credits);
  ``flag_multicast``      ``multimem.red`` on a flag (an NVLS barrier's arrival).
As on real NVLS, the issuer is part of the multicast team: its own replica crosses
NVLink too.

A region is cut at transfer-unit boundaries of its address, and each unit is striped
over the switch chips in proportion to their links, as NVLink's fine-grained address
interleave spreads it (``Fabric.stripe``): one train per chip. Every operation takes
the unit to use (``unit``; default: the system's ``transfer_unit_bytes``): a kernel
picks one for all its GPUs, so the same address is always cut and routed alike, and
merges and NVLS reductions of one address meet in one chip.
Completion callbacks run when the last piece is done (for stores, when the data is in
the destination memory, which is when a flag written behind it would be seen).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import numpy as np

from cais.engine import ArrivePerGpu, Bound, Completion, Countdown, Signal, Simulator, TbPlan, Train
from cais.config import SystemConfig
from cais.hw.fabric import Fabric
from cais.hw.gpu import (CopyLoop, Gpu, KeptLines, LoadPlan, LoadStream, RedPlan, RedStream, ReduceStream, SmPort,
                         StoreChains)
from cais.hw.memory import Region, as_run
from cais.hw.packets import Kind, Packetizer, VcMap

Done = Callable[[], None]
# Kinds whose payload the issuing GPU reads from its HBM to send (hw/hbm.py counts it).
FLAG_BYTES = 8  # a synchronisation flag: one 64-bit word (on the wire; not counted as payload data)
DoneData = Callable[[np.ndarray | None], None]
# One load of a TB's stream, as :meth:`Isa.ld_stream` takes it: (home, region, the
# region's stripes as :meth:`Isa.stripes` cuts it, where its data goes or None).
StreamLoad = tuple[int, Region, list[tuple[Region, int]], DoneData | None]
# One reduction of a piece of a TB's epilogue, as :meth:`Isa.red_stream` takes it:
# (kind, destination GPU, stripes, each stripe's data or None, signal word or -1,
# quorum); :meth:`Isa.red_op` and :meth:`Isa.red_cais_op` make them.
StreamRed = tuple[int, int, list[tuple[Region, int]], list[np.ndarray | None] | None, int, int]
# An item of a TB's epilogue: an add into the GPU's own memory (called in its turn),
# or a piece of partial rows for an owner, (its bytes, its reductions).
StreamItem = Callable[[], None] | tuple[int, list[StreamRed]]
# One destination of a sender SM's chunked stores, as :meth:`Isa.store_chains` takes it:
# (destination GPU, its tail flag's :meth:`Isa.flag_wire`, its chunks: (the stripes of
# each of the chunk's stores, its bytes, the countdowns its landing counts into)).
StoreChain = tuple[int, tuple[int, int, int, int], list[tuple[list[list[tuple[Region, int]]], int, list[Countdown]]]]
# One move of an SM's copy loop, as :meth:`Isa.copy_loop` takes it: (destination GPU,
# protocol, its stores' (stripes, bytes), the loop's time for a local move, the
# countdowns its landing counts into).
CopyMove = tuple[int, str, list[tuple[list[tuple[Region, int]], int]], int, list[Countdown]]


class IsaHost(Protocol):
    """What the ISA issues onto: a machine's clock, fabric, packetizer, VC map, config
    and GPUs (``cais.machine.Machine`` is one; the ISA knows nothing else of it)."""

    sim: Simulator
    fabric: Fabric
    pk: Packetizer
    vcmap: VcMap
    cfg: SystemConfig
    gpus: Sequence[Gpu]


class Isa:
    """Issues ISA operations of one machine (:class:`IsaHost`) onto its fabric."""

    def __init__(self, machine: IsaHost) -> None:
        self.m = machine
        self.sim = machine.sim
        self.fab = machine.fabric
        self.pk = machine.pk
        self.vcmap = machine.vcmap
        self.granule = machine.cfg.transfer_unit_bytes
        self.n = machine.cfg.gpus
        # stripes() per (region, unit): every GPU that loads or reduces one address cuts
        # it alike (not in mirror mode, where striping counts uneven units)
        self._stripes: dict[tuple, list[tuple[Region, int]]] = {}
        # a fence probe's (wire bytes, last packet's wire bytes, VC) per traffic class
        self._probes: dict[int, tuple[int, int, int]] = {}

    def request_bound(self, src: int) -> Bound:
        """GPU ``src``'s bound on outstanding remote SM requests (every TB that loads
        from or reduces into a peer takes its bytes there)."""
        return self.m.gpus[src].remote

    def sm_port(self, rate_GBps: float | None = None) -> SmPort:
        """An SM's store path at its copy bandwidth, or at ``rate_GBps`` of payload
        (a protocol whose loop, not the SM's copy rate, limits it: LL, LL128)."""
        bw = rate_GBps or self.m.cfg.gpu.sm_copy_bandwidth_GBps  # bytes per ns
        return SmPort(1000.0 / bw)

    # ---- helpers -----------------------------------------------------------------
    def pieces(self, region: Region, unit: int | None = None) -> list[Region]:
        """Cut a region at transfer-unit boundaries of its byte address (a 2-D block:
        into groups of whole rows of at most one unit, at least one row)."""
        return self.fab.interleave.pieces(region, unit or self.granule)

    def stripes(self, region: Region, unit: int | None = None) -> list[tuple[Region, int]]:
        """(sub-region, chip) trains of a region: its units, each striped over chips
        (the list is shared: callers must not change it)."""
        unit = unit or self.granule
        if self.fab.mirror:
            return self.fab.interleave.trains(region, unit)
        key = (region, unit)
        hit = self._stripes.get(key)
        if hit is None:
            if len(self._stripes) >= 1 << 16:
                self._stripes.clear()
            hit = self._stripes[key] = self.fab.interleave.trains(region, unit)
        return hit

    def piece_data(self, data: np.ndarray | None, region: Region, piece: Region) -> np.ndarray | None:
        """The part of ``data`` (for ``region``) that belongs to ``piece`` of it."""
        if data is None:
            return None
        if region.rows > 1:
            off = (piece.start - region.start) // region.stride
            return data[off:off + piece.rows]
        off = piece.start - region.start
        return as_run(region, data)[off:off + piece.count]

    @staticmethod
    def _counter(count: int, done: Done | None) -> Completion:
        """A completion over ``count`` trains: ``done()`` once all are in."""
        return Completion(count, done)

    @staticmethod
    def _gather(region: Region, pieces: list[tuple[Region, int]], done: DoneData) -> Completion:
        """A load's completion over its ``pieces``: ``done(data)`` once all are in, with
        the pieces' data put back together (None when they carried none)."""
        return Completion(len(pieces), done, region, pieces, _assemble)

    def _data(self, data: np.ndarray | None, region: Region,
              pieces: list[tuple[Region, int]]) -> list[np.ndarray | None] | None:
        """Each piece's part of ``data`` (None: no data, timing mode)."""
        return None if data is None else [self.piece_data(data, region, p) for p, _ in pieces]

    def _local(self, fn: Callable[[], object], done: Callable[..., None] | None, *args: object) -> None:
        fn()
        if done is not None:
            self.sim.after(0, done, *args)

    # ---- point to point ----------------------------------------------------------
    def st(self, src: int, dst: int, region: Region, data: np.ndarray | None, done: Done | None = None,
           port: SmPort | None = None, stream: int = 0, unit: int | None = None, fenced: Done | None = None,
           encoding: float = 1.0) -> None:
        """Store ``region`` on GPU ``dst``. ``done``: when the data has landed there;
        ``fenced``: when the stores' write responses are back at ``src`` (what a
        ``__threadfence_system`` after the stores waits for). The pieces that cross
        one chip travel in order on one VC, so the last of them carries the only
        response that chip's path needs (one header flit when writes are posted).
        ``encoding``: wire bytes per data byte of a protocol's line format (LL: 2,
        LL128: 128/120; kernels/protocols.py), the payload staying the data."""
        self._write(Kind.WRITE, src, dst, region, data, done, port, stream, unit, fenced, encoding)

    def red(self, src: int, dst: int, region: Region, data: np.ndarray | None, done: Done | None = None,
            port: SmPort | None = None, stream: int = 0, unit: int | None = None, fenced: Done | None = None) -> None:
        """Add ``region`` into GPU ``dst``'s memory; ``done``/``fenced`` as for :meth:`st`."""
        self._write(Kind.RED, src, dst, region, data, done, port, stream, unit, fenced)

    def add_local(self, src: int, region: Region, data: np.ndarray | None) -> None:
        """An SM's ``red`` into its own GPU's memory, done at once (nothing on the fabric)."""
        self.m.gpus[src].memory.add(region, data)

    def _write(self, kind: int, src: int, dst: int, region: Region, data: np.ndarray | None,
               done: Done | None, port: SmPort | None, stream: int, unit: int | None, fenced: Done | None,
               encoding: float = 1.0) -> None:
        mem = self.m.gpus[dst].memory
        if src == dst:
            op = mem.write if kind == Kind.WRITE else mem.add

            def both() -> None:
                if done is not None:
                    done()
                if fenced is not None:
                    fenced()
            self._local(lambda: op(region, data), both)
            return
        pieces = self.stripes(region, unit)
        landed = self._counter(len(pieces), done)
        fences: list[Completion | None] | None = None
        if fenced is not None:
            last = {chip: i for i, (_, chip) in enumerate(pieces)}  # chip -> its last piece: it carries the fence
            acked = self._counter(len(last), fenced)
            fences = [None] * len(pieces)
            for i in last.values():
                fences[i] = acked
        self.m.gpus[src].issue_pieces(kind, dst, pieces, landed, port, stream, False, self._data(data, region, pieces),
                                      encoding=encoding, fences=fences)

    def ld(self, src: int, home: int, region: Region, done: DoneData, stream: int = 0,
           unit: int | None = None) -> None:
        if src == home:
            data = self.m.gpus[home].memory.read(region)
            self._local(lambda: None, done, data)
            return
        pieces = self.stripes(region, unit)
        self.m.gpus[src].issue_pieces(Kind.READ_REQ, home, pieces, self._gather(region, pieces, done), None, stream,
                                      True)

    # ---- CAIS: mergeable loads and reductions ---------------------------------------
    def ld_cais(self, src: int, home: int, region: Region, done: DoneData, stream: int = 0,
                unit: int | None = None, expect: int = 0, quorum: int = 0) -> None:
        """``ld.cais``: ``ld`` from the home GPU with the CAIS bit set. The switch may
        merge it with the other GPUs' loads of the same address (hw/merge.py): one
        read of the home serves them all. ``expect``: requesters the access is shared
        by (0: every GPU but the home); ``quorum``: TB-aware throttling, the data is
        handed back once that many of them have asked (0: at once)."""
        if src == home:
            self.ld(src, home, region, done, stream, unit)
            return
        pieces = self.stripes(region, unit)
        self.m.gpus[src].issue_pieces(Kind.LD_CAIS_REQ, home, pieces, self._gather(region, pieces, done), None, stream,
                                      True, expect=expect, quorum=quorum)

    def ld_stream(self, src: int, loads: LoadPlan | list[StreamLoad], window: Bound, bound: Bound,
                  arrived: Countdown, cais: bool = False, quorum: int = 0,
                  kept: KeptLines | None = None, scope: int = 0) -> None:
        """A TB mainloop's remote loads (a :data:`StreamLoad` each), issued in this
        order by the core (:class:`cais._core.LoadStream`): each takes its bytes (at
        most a bound's limit) in the SM's ``window`` and then in the GPU's ``bound``,
        waiting first come, first served while either is full, and goes out as ``ld``
        (``cais``: ``ld.cais``, with ``quorum`` as for :meth:`ld_cais`). When its data
        is in it gives its bytes back, calls its placer with the data (if it has one;
        data is None in timing mode) and counts into ``arrived``. Every home must be
        another GPU. ``kept`` (a :class:`cais._core.KeptLines` shared by the GPU's TBs;
        None: every load goes out): a load whose ``(scope, home, region)`` is there
        (compared by value, in the core) joins the one asked for
        first (an L2 that keeps peer reads: a hit, or a miss in flight), taking no room
        and sending nothing; it checks before taking room and again once granted (then
        giving the room back). A load that goes out is entered there, a signal that
        fires with its data once it is in. ``loads`` may be a :class:`LoadPlan` shared by
        the GPUs that run a tile: the loads whose home is ``src`` are skipped (read
        locally)."""
        self.new_ld_stream(src, loads, window, bound, arrived, cais, quorum, kept, scope).start()

    def new_ld_stream(self, src: int, loads: LoadPlan | list[StreamLoad], window: Bound, bound: Bound,
                      arrived: Countdown, cais: bool = False, quorum: int = 0,
                      kept: KeptLines | None = None, scope: int = 0) -> LoadStream:
        """:meth:`ld_stream`'s stream, not started: a TB's plan starts it
        (``TbPlan.begin``)."""
        kind, assemble = self.ld_stream_form(cais)
        plan = loads if isinstance(loads, LoadPlan) else LoadPlan(loads)
        return LoadStream(self.m.gpus[src], kind, plan, window, bound, arrived, assemble, quorum, kept, scope, src)

    @staticmethod
    def ld_stream_form(cais: bool) -> tuple[int, Callable[..., np.ndarray]]:
        """What a stream's loads go out as (``ld``, or ``ld.cais`` where ``cais``) and
        how a load's data is put together from its stripes' (functional mode)."""
        return (Kind.LD_CAIS_REQ if cais else Kind.READ_REQ), _assemble

    def red_op(self, dst: int, region: Region, data: np.ndarray | None, unit: int | None = None) -> StreamRed:
        """A ``red`` into GPU ``dst`` as a stream issues it (see :meth:`red_stream`)."""
        pieces = self.stripes(region, unit)
        return (Kind.RED, dst, pieces, self._data(data, region, pieces), -1, 0)

    def red_cais_op(self, home: int, region: Region, data: np.ndarray | None, signal: int,
                    unit: int | None = None, quorum: int = 0) -> StreamRed:
        """A ``red.cais`` into another GPU, ``home``, as a stream issues it (see
        :meth:`red_cais` and :meth:`red_stream`)."""
        pieces = self.stripes(region, unit)
        return (Kind.RED_CAIS, home, pieces, self._data(data, region, pieces), signal, quorum)

    def red_stream(self, src: int, items: list[StreamItem] | RedPlan, window: Bound, bound: Bound, port: SmPort
                   ) -> Signal:
        """A TB epilogue's reductions, issued in this order by the core
        (:class:`cais._core.RedStream`): an item that is a callable (an add into the
        GPU's own memory) is called when the stream reaches it; a piece ``(nbytes,
        reds)`` takes ``nbytes`` (at most a bound's limit) in the SM's ``window`` and
        then in the GPU's ``bound``, waiting first come, first served while either is
        full, and its reductions (:meth:`red_op`, :meth:`red_cais_op`) go out through
        ``port``; it gives its bytes back once all their trains are acknowledged. The
        signal returned fires when the last item is out. ``items`` may be a
        :class:`RedPlan` shared by the GPUs that run a tile (timing mode): its blocks
        owned by ``src`` are added locally in their turn (the signal words they raise)."""
        return self.new_red_stream(src, items, window, bound, port).start()

    def new_red_stream(self, src: int, items: list[StreamItem] | RedPlan, window: Bound, bound: Bound, port: SmPort
                       ) -> RedStream:
        """:meth:`red_stream`'s stream, not started: a TB's plan starts it
        (``TbPlan.begin``) and waits for its signal."""
        if isinstance(items, RedPlan):
            return RedStream(self.m.gpus[src], items, window, bound, port, src)
        return RedStream(self.m.gpus[src], items, window, bound, port)

    def red_cais(self, src: int, home: int, region: Region, data: np.ndarray | None, signal: int,
                 done: Done | None = None, port: SmPort | None = None, stream: int = 0, unit: int | None = None,
                 expect: int = 0, quorum: int = 0) -> None:
        """``red.cais``: ``red`` into the home GPU with the CAIS bit set. The switch may
        sum it with the other GPUs' contributions to the same address and write the
        sum home once. Every reduction that lands adds (contributions it sums) x
        (its bytes) to the home's signal word ``signal``, after its data, so the home
        knows when all have arrived; the home's own partial (``src == home``) is
        added locally and signalled the same way. ``done``: when the switch has taken
        it (merged, or landed at the home if it went unmerged); with ``quorum``, once
        that many contributions to its address have reached the switch."""
        if src == home:
            gpu = self.m.gpus[home]

            def add() -> None:
                gpu.memory.add(region, data)
                gpu.signal(signal, region.nbytes)
            self._local(add, done)
            return
        kind, _, pieces, parts, _, _ = self.red_cais_op(home, region, data, signal, unit, quorum)
        self.m.gpus[src].issue_pieces(kind, home, pieces, self._counter(len(pieces), done), port, stream, False,
                                      parts, tag=signal, expect=expect, quorum=quorum)

    def wait_signal(self, gpu: int, key: int, target: int, reached: Done) -> None:
        """A kernel on GPU ``gpu`` polling its signal word ``key`` (which ``red.cais``
        and flags raise): ``reached`` runs once it is at least ``target``."""
        self.m.gpus[gpu].wait_signal(key, target, reached)

    def group_sync(self, src: int, group: int, members: int) -> Signal:
        """A TB registers with TB group ``group`` (``members`` GPUs) at the Group Sync
        Table of the chip the group's key maps to (one empty packet up). The signal it
        returns fires when the switch's release has come back (one empty packet down),
        i.e. once every member has registered; the core fires it, so a TB program
        waiting on it resumes without a Python call in between."""
        return self.m.gpus[src].group_sync(self.flag_chip(group), group, members)

    def group_sync_step(self, plan: TbPlan, src: int, group: int, members: int) -> None:
        """:meth:`group_sync` as a step of a TB's plan: the core registers the TB when
        the plan reaches the step, and the plan waits for the release."""
        plan.begin(self.m.gpus[src], self.flag_chip(group), group, members)

    # ---- CAIS-EP: dynamic multicast ---------------------------------------------------
    def st_mc_dyn(self, src: int, group: int, members: int, region: Region, data: np.ndarray | None,
                  done: Done | None = None, port: SmPort | None = None, stream: int = 0,
                  unit: int | None = None) -> None:
        """``st.mc.dyn``: store ``region`` to dynamic multicast group ``group`` of this
        GPU's port (``members`` GPUs; an EpSwitch copies each train to them, at the same
        address on each). ``done``: when every member's copy has landed."""
        pieces = self.stripes(region, unit)
        self.m.gpus[src].issue_pieces(Kind.MC_DYN_STORE, -1, pieces, self._counter(len(pieces) * members, done), port,
                                      stream, False, self._data(data, region, pieces), tag=group)

    # ---- NVLS --------------------------------------------------------------------
    def multimem_st(self, src: int, region: Region, data: np.ndarray | None, done: Done | None = None,
                    port: SmPort | None = None, stream: int = 0, unit: int | None = None) -> None:
        pieces = self.stripes(region, unit)
        self.m.gpus[src].issue_pieces(Kind.MC_STORE, -1, pieces, self._counter(len(pieces) * self.n, done), port, stream,
                                      False, self._data(data, region, pieces))

    def multimem_red(self, src: int, region: Region, data: np.ndarray | None, done: Done | None = None,
                     port: SmPort | None = None, stream: int = 0, unit: int | None = None) -> None:
        pieces = self.stripes(region, unit)
        self.m.gpus[src].issue_pieces(Kind.MC_RED, -1, pieces, self._counter(len(pieces) * self.n, done), port, stream,
                                      False, self._data(data, region, pieces))

    def multimem_ld_reduce(self, src: int, region: Region, done: DoneData, stream: int = 0,
                           unit: int | None = None) -> None:
        pieces = self.stripes(region, unit)
        self.m.gpus[src].issue_pieces(Kind.MC_LDRED_REQ, -1, pieces, self._gather(region, pieces, done), None, stream,
                                      True)

    def store_chains(self, src: int, chains: list[StoreChain], port: SmPort) -> Signal:
        """A sender SM's chunked stores to its peers, issued by the core (timing mode;
        :class:`cais._core.StoreChains`): per destination, in the order of ``chains``,
        ``(dst, flag_wire, chunks)``, each chunk ``(parts, nbytes, landed)``: the
        :meth:`stripes` of each of its stores, its bytes and the countdowns it counts
        into. A destination's chunks go out one at a time through ``port`` as
        :meth:`st` with ``fenced``: once a chunk's write responses are back its tail
        goes out as :meth:`flag` (``flag_wire``: :meth:`flag_wire`), its landing
        counting into ``landed``, and the next chunk follows. A chunk to ``src``
        itself takes the port's time for its bytes, then counts in. The signal
        returned fires once every destination's last chunk has been released."""
        return StoreChains(self.m.gpus[src], self.sim, port, src, chains).start()

    def copy_loop(self, src: int, moves: list[CopyMove], port: SmPort, ll_port: SmPort, ll_encoding: float,
                  flag_wire: Callable[[int], tuple[int, int, int, int]], stream: int, limit: int) -> Signal:
        """An SM's copy loop, issued by the core (timing mode; :class:`cais._core.CopyLoop`):
        ``moves`` in order, each ``(dst, protocol, parts, pause, landed)``. A "local"
        move holds the loop for ``pause`` ps; a remote one's parts (``(stripes, nbytes)``,
        :meth:`stripes` each) go out as :meth:`st` through ``port`` ("plain"), through
        ``ll_port`` in LL's line format ("ll", ``ll_encoding``) or, "simple", as
        :meth:`st` with ``fenced`` followed by :meth:`flag` (``flag_wire(dst)`` is
        called as each such part goes out: a new flag's :meth:`flag_wire`), each part
        first taking its bytes in a window of ``limit`` bytes (soft: admitted whenever
        nothing is in flight). A part lands with its stores or, Simple, its flag; its
        bytes are given back, then a move whose parts have all landed counts into
        ``landed``. The signal returned fires once every move has gone out and landed."""
        return CopyLoop(self.m.gpus[src], self.sim, src, moves, port, ll_port, ll_encoding, flag_wire, stream,
                        limit).start()

    def ld_reduce_stream(self, src: int, pieces: list[Region], out: str, limit: int, port: SmPort, stream: int = 0,
                         unit: int | None = None) -> Signal:
        """The reduce warps of a staged NVLS AllReduce step, issued by the core
        (:class:`cais._core.ReduceStream`): each of ``pieces`` goes out as
        :meth:`multimem_ld_reduce`, in order, while at most ``limit`` bytes are in
        flight (a soft limit: a piece is admitted whenever nothing is, as
        :class:`cais.kernels.common.Window`); when a piece's sum is back, its bytes
        are given back first (the next pieces go out), then the sum goes out as
        :meth:`multimem_st` into the same elements of buffer ``out`` through ``port``.
        The signal returned fires once every piece's sum has gone out."""
        plan = []
        for piece in pieces:
            loads = self.stripes(piece, unit)
            dst = Region(out, piece.start, piece.count, piece.elem_bytes)
            stores = self.stripes(dst, unit)
            plan.append((piece, loads, dst, stores))
        gpu = self.m.gpus[src]
        data = (_assemble, self._data) if gpu.memory.functional else (None, None)
        return ReduceStream(gpu, plan, limit, port, stream, self.n, *data).start()

    # ---- synchronisation ---------------------------------------------------------
    def flag(self, src: int, dst: int, key: int, landed: Callable[[], None]) -> None:
        """Store a flag (an 8 B word, ``key`` chooses its address) on GPU ``dst``:
        ``landed`` runs when the flag is visible there (a peer polling it sees it)."""
        if src == dst:
            self._local(lambda: None, landed)
            return
        chip, vc, wire, last = self.flag_wire(src, dst, key)
        train = Train(0, wire, last, kind=Kind.FLAG, src=src, dst=dst, chip=chip, done=lambda _t: landed(), vc=vc)
        self.fab.inject(train)

    def flag_wire(self, src: int, dst: int, key: int) -> tuple[int, int, int, int]:
        """How :meth:`flag` sends flag ``key`` from GPU ``src`` to ``dst``: (the chip its
        address maps to, its VC, its train's wire bytes, its last packet's)."""
        kind = Kind.FLAG
        return (self.flag_chip(key), self.vcmap.vc(kind, src=src, dst=dst, n=self.n), *self.pk.wire(kind, FLAG_BYTES))

    def flag_multicast(self, src: int, key: int, landed: Callable[[int], None]) -> None:
        """``multimem.red`` on a flag: the switch adds it into every GPU's copy of the
        flag (the issuer's included); ``landed(gpu)`` runs as each copy lands."""
        kind = Kind.MC_FLAG
        train = Train(0, *self.pk.wire(kind, FLAG_BYTES), kind=kind, src=src, dst=-1,
                      chip=self.flag_chip(key), done=lambda t: landed(t.dst), vc=self.vcmap.vc(kind))
        self.fab.inject(train)

    def flag_multicast_counts(self, src: int, key: int, counts: list[Countdown]) -> None:
        """:meth:`flag_multicast` whose landing on GPU ``g`` is ``counts[g].arrive(sim)``,
        counted in the core (:class:`cais._core.ArrivePerGpu`) without a Python call
        per copy."""
        kind = Kind.MC_FLAG
        train = Train(0, *self.pk.wire(kind, FLAG_BYTES), kind=kind, src=src, dst=-1,
                      chip=self.flag_chip(key), done=ArrivePerGpu(self.sim, counts), vc=self.vcmap.vc(kind))
        self.fab.inject(train)

    def release_flag(self, src: int, dst: int, traffic: int, landed: Done) -> None:
        """A flag stored on ``dst`` behind this GPU's earlier writes of class
        ``traffic`` to it (``st.release``/``red.release`` of a counter): one flag down
        every chip's path, on the writes' VC, so each lands after them; ``landed`` runs
        on ``dst`` when all have (the peer polling the flag then sees the data)."""
        if src == dst:
            self._local(lambda: None, landed)
            return
        chips = len(self.fab.switches)
        arrived = self._counter(chips, landed)
        kind = Kind.FLAG
        wire, last = self.pk.wire(kind, FLAG_BYTES)
        vc = self.vcmap.vc(kind, traffic, src=src, dst=dst, n=self.n)
        for c in range(chips):
            self.fab.inject(Train(0, wire, last, kind=kind, src=src, dst=dst, chip=c, vc=vc, cls=traffic,
                                  done=arrived))

    def release_flag_multicast(self, src: int, traffic: int, landed: Callable[[int], None]) -> None:
        """``multimem.red.release`` of a flag behind this GPU's earlier multicast
        writes of class ``traffic``: one flag down every chip's path, multicast by the
        switch; ``landed(gpu)`` runs on each GPU once all chips' copies are there."""
        chips = len(self.fab.switches)
        seen = [0] * self.n

        def arrived(train: Train) -> None:
            seen[train.dst] += 1
            if seen[train.dst] == chips:
                landed(train.dst)
        kind = Kind.MC_FLAG
        wire, last = self.pk.wire(kind, FLAG_BYTES)
        vc = self.vcmap.vc(kind, traffic)
        for c in range(chips):
            self.fab.inject(Train(0, wire, last, kind=kind, src=src, dst=-1, chip=c, vc=vc, cls=traffic,
                                  done=arrived))

    def fence(self, src: int, dsts: Iterable[int], traffic: int, done: Done) -> None:
        """``__threadfence_system`` after remote writes of class ``traffic`` to
        ``dsts``: a zero-payload probe follows the writes down every chip's path to
        every destination, on their VC (so it lands after them), and ``done`` runs
        when every probe's write response is back."""
        chips = len(self.fab.switches)
        peers = sorted(d for d in set(dsts) if d != src)
        if not peers or not chips:
            self._local(lambda: None, done)
            return
        acked = self._counter(len(peers) * chips, done)
        probe = self._probes.get(traffic)
        if probe is None:  # (wire, last packet's wire, VC) of a probe of this class
            kind = Kind.FLAG
            probe = self._probes[traffic] = (*self.pk.wire(kind, FLAG_BYTES), self.vcmap.vc(kind, traffic))
        # one probe per (destination, chip), in that order, built and put on the ports by the core
        self.fab.gpus[src].fence_probes(peers, chips, *probe, traffic, acked)

    def flag_chip(self, key: int) -> int:
        """The chip a flag's address maps to (every GPU's copy of one flag, alike): a
        link chosen by a hash of the key, so flags spread over chips like data."""
        return self.fab.interleave.chip_of(key)


def _assemble(region: Region, pieces: list[tuple[Region, int]], parts: dict[int, np.ndarray]) -> np.ndarray:
    """A load's data from its pieces' (``parts``, by start element), in order."""
    got = [parts[p.start] for p, _ in pieces]
    if region.rows > 1:  # a block's rows (a chip's share may be a single row, read as a run)
        got = [np.reshape(d, (-1, region.count)) for d in got]
    return np.concatenate(got)  # rows or runs, in order
