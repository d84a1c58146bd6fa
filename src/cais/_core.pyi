"""The compiled event core (rust/, built by maturin as ``cais._core``): its Python
interface, typed. The classes are documented where they are defined (``rust/src``);
``cais.engine`` and ``cais.hw.switch`` are where the rest of the simulator meets them."""

from collections.abc import Callable, Iterable
from typing import Any, Self, final

from typing_extensions import disjoint_base

__all__ = [
    "Simulator",
    "Train",
    "Region",
    "Interleave",
    "Signal",
    "Countdown",
    "Bound",
    "Process",
    "TbPlan",
    "LoadPlan",
    "LoadStream",
    "KeptLines",
    "RowBlocks",
    "RedForm",
    "RedPlan",
    "RedStream",
    "TilePlans",
    "ReduceTbs",
    "LoadTbs",
    "CoreTb",
    "ReduceStream",
    "ReducedPiece",
    "StoreChains",
    "ChainStep",
    "CopyLoop",
    "CopyStep",
    "Channel",
    "Credits",
    "SwitchChip",
    "SwitchLedger",
    "Endpoint",
    "HbmShare",
    "HbmPhase",
    "Completion",
    "ArrivePerGpu",
    "SmPort",
    "TbDispatcher",
    "MergeUnit",
    "MergeStats",
    "PortSpread",
    "Session",
    "FreeLines",
    "CORE_KINDS",
    "heap_yardstick",
    "replacement_policies",
]

CORE_KINDS: dict[str, int]

def heap_yardstick(n: int, pending: int) -> tuple[float, int]:
    """``benchmarks/bench_core.py``'s ``heapq`` loop on Rust's ``BinaryHeap``: ``n``
    pop/push of (time, seq) with ``pending`` waiting; (seconds, last time popped)."""

def replacement_policies() -> list[str]:
    """The merge unit's replacement policies the core registers, by the names
    ``switch.merge.replacement`` takes (the default first)."""

@final
class Simulator:
    TICK_EVERY: int
    now: int
    events: int
    @property
    def events_by_kind(self) -> dict[str, int]: ...  # call, arbitrate, arrive, step, due
    pending: int  # events waiting in the queue
    tick: Callable[[int, int], None] | None
    tick_every: int
    def __new__(cls) -> Self: ...
    def at(self, time: int, fn: Callable[..., Any], *args: Any) -> None: ...
    def after(self, delay: int, fn: Callable[..., Any], *args: Any) -> None: ...
    def next_time(self) -> int | None: ...
    def run(self, until: int | None = None) -> int: ...

@final
class Region:
    """Elements of a named buffer: ``rows`` runs of ``count`` elements from ``start``,
    each ``stride`` after the previous; ``elem_bytes`` per element. Immutable."""
    buffer: str
    start: int
    count: int
    elem_bytes: int
    rows: int
    stride: int
    def __new__(cls, buffer: str, start: int, count: int, elem_bytes: int = 2, rows: int = 1,
                 stride: int = 0) -> Self: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def byte_offset(self) -> int: ...
    def sub(self, start: int, count: int) -> Region: ...
    def row_block(self, first: int, rows: int) -> Region: ...
    @staticmethod
    def block(buffer: str, row_len: int, r0: int, nrows: int, c0: int, ncols: int,
              elem_bytes: int = 2) -> Region: ...
    def __hash__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Interleave:
    """NVLink's address interleave: units cut from regions, dealt over the links."""
    mirror: bool
    uneven_units: int
    uneven_packets: int
    mirror_packets: int
    def __new__(cls, link_chip: list[int], max_payload: int, mirror: bool = False) -> Self: ...
    def stripe(self, unit_index: int, slots: int) -> list[tuple[int, int]]: ...
    def chip_of(self, key: int) -> int: ...
    def pieces(self, region: Region, unit: int) -> list[Region]: ...
    def trains(self, region: Region, unit: int) -> list[tuple[Region, int]]: ...

@final
class LoadPlan:
    """A tile's planned mainloop loads, (home, region, stripes, placed) each, converted
    once and shared by the GPUs that run the tile; a GPU's stream skips its own."""
    def __new__(cls, loads: list[tuple[int, Region, list[tuple[Region, int]], Any]]) -> Self: ...
    @staticmethod
    def cut(interleave: Interleave, loads: list[Any], piece: int, unit: int, skip: int | None = None) -> LoadPlan:
        """``loads`` (``Load``s: home at index 1, region at 2) cut into request pieces of
        at most ``piece`` bytes and their trains of ``unit``; those of home ``skip`` left
        out (timing mode: nothing to place)."""
    @staticmethod
    def cut_steps(interleave: Interleave, operands: list[tuple[bool, str, int, int, int, int]],
                  steps: list[tuple[int, int]], elem_bytes: int, piece: int, unit: int,
                  skip: int | None = None) -> list[LoadPlan]:
        """A tile's K steps, each the :meth:`cut` of its :meth:`tile_loads`."""
    @staticmethod
    def tile_loads(operands: list[tuple[bool, str, int, int, int, int]], steps: list[tuple[int, int]],
                   elem_bytes: int) -> list[list[tuple[int, int, Region, int, int, int, int]]]:
        """A load GEMM tile's loads per K step (``steps``: (first K, K)): each operand's
        (K over tokens, buffer, rows per owner, columns, tile's first row or column,
        count) stored block on its owners, as ``Load`` fields."""
    @staticmethod
    def chain(plans: list[LoadPlan]) -> LoadPlan:
        """The loads of ``plans``, one after the other."""
    def loads(self, skip: int | None = None) -> int: ...
    def stripes(self, skip: int | None = None) -> int: ...
    def __len__(self) -> int: ...

@final
class LoadStream:
    """A TB mainloop's remote loads, issued in order under the SM's window and the
    GPU's bound; each load's data goes to its placer, and ``arrived`` counts them."""
    issued: int
    def __new__(cls, gpu: Endpoint, kind: int,
                 loads: LoadPlan | list[tuple[int, Region, list[tuple[Region, int]], Any]],
                 window: Bound, bound: Bound, arrived: Countdown, assemble: Callable[..., Any],
                 quorum: int = 0, kept: KeptLines | None = None,
                 scope: int | None = None, skip: int | None = None) -> Self: ...
    def start(self) -> None: ...

@final
class KeptLines:
    """The loads a GPU's TBs have asked for and may share, by (scope, home, region),
    each a signal that fires with its data; its length is the loads that went out."""
    def __new__(cls) -> Self: ...
    def __len__(self) -> int: ...

@final
class RowBlocks:
    """The LN row blocks of every owner's shard (``rows_l`` rows an owner, blocks of
    ``block_rows`` rows, rows of ``width`` elements) and each block's signal word: an
    epilogue's partial rows are cut where a block or a shard ends."""
    def __new__(cls, width: int, rows_l: int, block_rows: int, keys: list[int]) -> Self: ...
    def cut(self, region: Region, owner: int) -> list[tuple[int, Region, int]]: ...

@final
class RedForm:
    """How a GEMM-RS epilogue's partial rows go out (``kind``, trains of ``unit`` bytes,
    ``quorum``) and how the owner counts them (signal word ``signal``, or ``blocks``'
    words; -1 and no blocks: not counted); the owner's own add raises the same words."""
    def __new__(cls, kind: int, unit: int, signal: int = ..., quorum: int = 0,
                blocks: RowBlocks | None = None) -> Self: ...

@final
class RedPlan:
    """A tile's epilogue in timing mode, (owner, region) blocks in order made into
    pieces and reductions once and shared by the GPUs that run the tile; a GPU adds its
    own block locally (the signal words it raises)."""
    @staticmethod
    def build(interleave: Interleave, form: RedForm, blocks: list[tuple[int, Region]], piece: int,
              skip: int | None = None) -> RedPlan: ...
    @staticmethod
    def tile(interleave: Interleave, form: RedForm, reduced: tuple[str, int, int], rows: tuple[int, int],
             cols: tuple[int, int], elem_bytes: int, piece: int, skip: int | None = None) -> RedPlan: ...
    def owners(self, g: int) -> list[int]: ...
    def stripes(self, g: int) -> int: ...
    def pieces(self, g: int) -> list[tuple[int, list[tuple[int, int, list[Any], int, int]]]]: ...
    def own_signals(self, g: int) -> list[tuple[int, int]]: ...
    def __len__(self) -> int: ...

@final
class RedStream:
    """A TB epilogue's reductions, issued in order under the SM's window and the GPU's
    bound through the SM's store port; an item is a local add (a callable) or a piece
    ``(nbytes, [(kind, dst, stripes, data, tag, quorum), ...])``."""
    reductions: int
    def __new__(cls, gpu: Endpoint, items: RedPlan | list[Any], window: Bound, bound: Bound, port: SmPort,
                own: int | None = None) -> Self: ...
    def start(self) -> Signal: ...

@final
class TilePlans:
    """A GEMM's tile plans, keyed by three ints, shared by the TBs that take them (the
    GPUs that run the GEMM, the tiles that load the same blocks): built by the first
    that takes one (its builder also says how many take it), dropped at the last."""
    def __new__(cls) -> Self: ...
    def __len__(self) -> int: ...

@final
class ReduceTbs:
    """A GEMM-RS kernel's TBs on one GPU, their plans made in the core: TB ``t`` registers
    with group ``base + t * per`` of each ``syncs`` entry (None: no registration), times
    its mainloop as ``phases.of(busy)``, reduces its tile's plan (:meth:`RedPlan.tile` of
    the tile's rows and columns of ``reduced`` = (buffer, rows an owner, columns), with
    ``shape`` = (M, N, BM, BN), as ``form`` says; shared through ``tiles`` by the
    ``users`` GPUs that run it, the block of ``skip`` unsent) under its SM's
    ``sm_state(sm)`` = (window, bound, port, piece), adding its own rows locally."""
    plans_made: int
    def __new__(cls, gpu: Endpoint, src: int, interleave: Interleave,
                syncs: tuple[tuple[int, int, int] | None, tuple[int, int, int] | None], phases: Any,
                sm_state: Callable[[int], tuple[Bound, Bound, SmPort, int]], tiles: TilePlans, form: RedForm,
                reduced: tuple[str, int, int], shape: tuple[int, int, int, int], elem_bytes: int, users: int,
                skip: int | None = None, early_access: bool = False) -> Self: ...
    def tbs(self, tiles: list[tuple[int, int]]) -> list[CoreTb]: ...

@final
class LoadTbs:
    """A remote-loading GEMM's TBs on one GPU, their plans made in the core: TB ``t``
    registers with its ``syncs`` groups (as :class:`ReduceTbs`), waits for
    ``ready(i)`` (its row tile's operand signals), times its mainloop as
    ``phases.of(busy)``, loads tile plan ``key`` (``build(key, 0, 0)`` returns the
    :class:`LoadPlan` and how many TBs take it, shared through ``tiles``) as a
    :class:`LoadStream` (``kind``, ``quorum``, ``assemble``, ``kept``) under a window of
    ``window`` bytes and the GPU's ``bound``, then rests ``rest`` = (num, den) of its
    compute after the last load."""
    def __new__(cls, gpu: Endpoint, src: int, interleave: Interleave,
                syncs: tuple[tuple[int, int, int] | None, tuple[int, int, int] | None],
                ready: Callable[[int], list[Signal]], phases: Any, window: int, bound: Bound, kind: int,
                quorum: int, assemble: Callable[..., Any], kept: KeptLines | None, tiles: TilePlans,
                build: Callable[[int, int, int], tuple[LoadPlan, int]], rest: tuple[int, int],
                early_access: bool = False) -> Self: ...
    def tbs(self, rows: list[int], keys: list[int], scopes: list[int]) -> list[CoreTb]: ...

@final
class CoreTb:
    """One TB of a kernel whose TB plans the core makes (:class:`LoadTbs`,
    :class:`ReduceTbs`, or one HBM phase: :meth:`phase`): called with ``(sm, busy)``
    (the dispatcher plans it without the call), its factory returns the TB's plan."""
    @staticmethod
    def phase(phase: HbmPhase) -> CoreTb: ...
    def __call__(self, sm: int, busy: int) -> TbPlan: ...

@final
class ReduceStream:
    """The reduce warps of one staged NVLS AllReduce step on its head GPU: each piece
    ``(region, loads, out, stores)`` goes out as ``multimem.ld_reduce`` while the bytes in
    flight stay within ``limit`` (a soft limit), and its sum as ``multimem.st`` to ``out``
    once it is back; ``start`` returns the signal that fires when every sum has gone out."""
    next: int
    used: int
    def __new__(cls, gpu: Endpoint, pieces: list[tuple[Region, list[tuple[Region, int]], Region,
                                                      list[tuple[Region, int]]]],
                limit: int, port: SmPort, stream: int, copies: int, assemble: Callable[..., Any] | None = None,
                split: Callable[..., Any] | None = None) -> Self: ...
    def start(self) -> Signal: ...

@final
class ReducedPiece:
    """A piece of a :class:`ReduceStream` in flight (its completion's callback)."""
    def __call__(self, data: Any) -> None: ...

@final
class StoreChains:
    """A sender SM's chunked stores (DeepEP's normal sender, timing mode): per
    destination ``(dst, (chip, vc, wire, last), chunks)``, each chunk ``(parts, nbytes,
    landed)``; a chunk's tail flag follows its write responses, then the next chunk;
    ``start`` returns the signal that fires when every chain has released its last."""
    issued: int
    def __new__(cls, gpu: Endpoint, sim: Simulator, port: SmPort, src: int,
                chains: list[tuple[int, tuple[int, int, int, int],
                                   list[tuple[list[list[tuple[Region, int]]], int, list[Countdown]]]]]) -> Self: ...
    def start(self) -> Signal: ...

@final
class ChainStep:
    """A chunk of a :class:`StoreChains` in flight (its completions' unit)."""

@final
class CopyLoop:
    """An SM's windowed copy loop (``kernels/ep_common.copy_tb``, timing mode): moves
    ``(dst, protocol, parts, pause, landed)`` in order, ``protocol`` one of "local",
    "plain", "ll", "simple"; ``start`` returns the signal that fires once every move has
    gone out and landed."""
    used: int
    def __new__(cls, gpu: Endpoint, sim: Simulator, src: int,
                moves: list[tuple[int, str, list[tuple[list[tuple[Region, int]], int]], int, list[Countdown]]],
                port: SmPort, ll_port: SmPort, ll_encoding: float,
                flag_wire: Callable[[int], tuple[int, int, int, int]], stream: int, limit: int) -> Self: ...
    def start(self) -> Signal: ...

@final
class CopyStep:
    """A part or move of a :class:`CopyLoop` in flight (its completions' unit)."""

@final
class Train:
    payload: int
    wire: int
    packet_wire: int
    head: int
    tail: int
    vc: int
    fp: int
    credits: Credits | None
    kind: int
    cls: int
    src: int
    dst: int
    chip: int
    addr: Any
    data: Any
    done: Callable[[Train], None] | None
    fence: Callable[[Train], None] | None
    want: int
    tag: int
    parent: Train | None
    left: int
    dep0: int
    dep1: int
    count: int
    expect: int
    quorum: int
    # chip and tag default to -1 (none), written `...` as the runtime's text signature shows a negative default
    def __new__(klass, payload: int, wire: int, packet_wire: int, kind: int, src: int, dst: int, chip: int = ...,
                 addr: Any = None, data: Any = None, done: Callable[[Train], None] | None = None, vc: int = 0,
                 cls: int = 0, want: int = 0, tag: int = ..., count: int = 1, expect: int = 0,
                 quorum: int = 0) -> Self: ...

@final
class Credits:
    name: str
    vcs: int
    capacity: int
    return_ps: int
    drains: bool
    drain_kinds: frozenset[int]
    free: list[int]
    ramped: list[int]
    held: list[int]
    peak: list[int]
    log: list[tuple[int, int, int]] | None
    def __new__(cls, name: str, vcs: int, capacity: int, return_ps: int, drains: bool = False,
                 drain_kinds: Iterable[int] | None = None) -> Self: ...
    def footprint(self, wire: int) -> int: ...
    def earliest(self, vc: int, fp: int, ser_ps: int, now: int) -> int | None: ...
    def take(self, vc: int, fp: int, arrive_ps: int) -> None: ...
    def stream(self, vc: int, fp: int, head_ps: int, tail_ps: int) -> None: ...
    def hold(self, vc: int, fp: int, now: int) -> None: ...
    def give_back(self, vc: int, fp: int, t0: int, t1: int, notify: bool = True) -> None: ...
    def on_return(self, waiter: Channel | Callable[[int], None]) -> None: ...
    def _fold(self, vc: int, now: int) -> None: ...

@disjoint_base
class Channel:
    name: str
    ps_per_byte: float
    latency_ps: int
    free_at: int
    trains: int
    payload_bytes: int
    wire_bytes: int
    busy_ps: int
    delivered_payload: int
    copies: int  # of its trains, a switch chip's copies made as they went on the wire
    timeline: list[tuple[int, int, int]] | None
    credits: Credits | None
    credit_rtt_ps: int
    def __new__(cls, sim: Simulator, name: str, ps_per_byte: float, latency_ps: int, vcs: int = 1,
                 record_timeline: bool = False, credits: Credits | None = None, credit_rtt_ps: int = 0) -> Self: ...
    def send(self, train: Train, deliver: SwitchChip | Endpoint | Callable[[Train], None],
             on_start: Callable[[Train, int, int], None] | None = None) -> None: ...
    def waiting(self) -> list[tuple[int, int, bool]]: ...
    def utilisation(self, span_ps: int) -> float: ...

@final
class SwitchLedger:
    bytes_in: int
    bytes_out: int
    multicast_created: int
    reduction_absorbed: int
    def balanced(self) -> bool: ...

@disjoint_base
class SwitchChip:
    sim: Simulator
    chip: int
    down: list[Channel]
    gpus: list[Any]
    pk: Any
    vcmap: Any
    pipeline_ps: int
    reduce_ps: int
    reduce_ps_per_byte: float
    engine_free_at: int
    ledger: SwitchLedger
    held: list[list[int]]
    handlers: dict[int, Callable[[Train], None]]
    merge_cfg: Any
    sync_entries: int
    mirror: bool
    nvls: bool
    units: list[MergeUnit]
    # cfg: a cais.config.SystemConfig; read: link.vcs, switch.pipeline_latency_ns, switch.reduce_latency_ns,
    # switch.reduce_GBps, switch.merge, cais.sync_entries, cais.sync_timeout_us
    def __new__(cls, sim: Simulator, chip: int, down: Iterable[Channel], gpus: Iterable[Any], packetizer: Any,
                 vcmap: Any, cfg: Any) -> Self: ...
    def receive(self, train: Train) -> None: ...
    def emit(self, out: Train, dst: int, entry: Train | None,
             on_start: Callable[[Train, int, int], None] | None = None) -> None: ...
    def multicast(self, train: Train) -> None: ...
    def multicast_to(self, train: Train, dsts: list[int], kind: int) -> None: ...
    def retire(self, entry: Train, t0: int, t1: int, credits: Credits | None, fp: int) -> None: ...
    def consume(self, entry: Train) -> None: ...
    def absorb(self, entry: Train) -> None: ...
    def stuck(self) -> list[str]: ...
    def enable_group_sync(self) -> None: ...
    @property
    def group_sync(self) -> tuple[int, int] | None: ...
    @property
    def sync_timeouts(self) -> int: ...

@final
class HbmPhase:
    ps: int
    nbytes: float
    overlapped: bool
    def __new__(cls, ps: int, nbytes: float, overlapped: bool = False) -> Self: ...

@final
class HbmShare:
    supply: float
    streams_yield: bool
    window: int
    enabled: bool
    stream_bytes: float
    phases: int
    stretched: int
    added_ps: int
    saturated: int
    saturated_demand: list[float]
    def __new__(cls, bytes_per_ps: float, window_ps: int, enabled: bool = True,
                 streams_yield: bool = False) -> Self: ...
    def request(self, sim: Simulator, ps: int, nbytes: float) -> Signal: ...
    def kernel_rate(self, now: int) -> float: ...
    def stream(self, now: int, nbytes: float) -> None: ...
    def stream_rate(self, now: int) -> float: ...

@disjoint_base
class Endpoint:
    sim: Simulator
    index: int
    memory: Any
    pk: Any
    vcmap: Any
    memory_latency_ps: int
    serve_bytes: int
    serving: int
    hbm: HbmShare
    handlers: dict[int, Callable[[Train], bool]]
    signals: dict[int, int]
    injected: int
    # cfg: a cais.config.SystemConfig; read: gpu.memory_latency_ns, gpu.read_serve_kB, switch.chips, link.vcs
    def __new__(cls, sim: Simulator, index: int, cfg: Any, memory: Any, packetizer: Any, vcmap: Any,
                 hbm: HbmShare | None = None) -> Self: ...
    def connect(self, up: list[Channel], switches: list[SwitchChip], write_ack_flits: int) -> None: ...
    def receive(self, train: Train) -> None: ...
    def inject(self, train: Train, head: int | None = None, tail: int | None = None,
               on_start: Callable[[Train, int, int], None] | None = None) -> None: ...
    def fence_probes(self, dsts: list[int], chips: int, wire: int, last: int, vc: int, cls: int,
                     acked: Completion) -> None: ...
    def group_sync(self, chip: int, group: int, members: int) -> Signal: ...
    # tag defaults to -1 (none), here and in issue_pieces, written `...` as in Train
    def issue(self, kind: int, dst: int, chip: int, addr: Any, data: Any, done: Callable[[Train], None] | None,
              payload: int, nbytes: int, want: int = 0, fence: Callable[[Train], None] | None = None, tag: int = ...,
              expect: int = 0, quorum: int = 0, stream: int = 0, head: int | None = None,
              tail: int | None = None) -> None: ...
    def issue_pieces(self, kind: int, dst: int, stripes: list[tuple[Any, int]], done: Completion,
                     port: SmPort | None = None, stream: int = 0, loads: bool = False, data: list[Any] | None = None,
                     tag: int = ..., expect: int = 0, quorum: int = 0, encoding: float = 1.0,
                     fences: list[Completion | None] | None = None) -> None: ...
    def ack(self, write: Train) -> None: ...
    def signal(self, key: int, amount: int) -> None: ...
    def wait_signal(self, key: int, target: int, fn: Callable[[], None]) -> None: ...
    def stuck(self) -> list[str]: ...

@final
class MergeStats:
    merged: int
    bypassed: int
    bypassed_loads: int
    evicted: int
    timed_out: int
    tracked: int
    sessions: int
    peak_lines: int
    line_ps: int
    busy_ps: int
    skew_n: int
    skew_sum_ps: int
    skew_max_ps: int
    lookups: int
    lookup_wait_ps: int

@final
class PortSpread:
    active: int
    since: int
    any_ps: int
    port_ps: int
    def __new__(cls) -> Self: ...
    def change(self, now: int, delta: int) -> None: ...
    def until(self, end: int) -> tuple[int, int]: ...

@final
class Session:
    id: int
    state: str
    count: int
    expect: int
    quorum: int
    lines: int
    addr: Any
    data: Any
    signal: int
    cls: int
    vc: int
    head: int
    touched: int
    doomed: bool

@final
class FreeLines:
    def __call__(self, *args: Any) -> None: ...

@final
class MergeUnit:
    sim: Simulator
    spread: PortSpread
    port: int
    capacity: int
    line_bytes: int
    replacement: str  # switch.merge.replacement: "lru" or "fifo"
    timeout_ps: int
    latency_ps: int
    lookup_ps: int  # the time between two access slots (1 / switch.merge.lookups_per_ns); 0: no limit
    red_accesses: int  # the access slots a reduction's line takes (switch.merge.red_accesses)
    default_expect: int
    used: int
    stats: MergeStats
    tensor_peak: dict[str, int]
    table: dict[tuple[int, Any], Session]
    log: list[tuple[int, int]] | None
    # cfg: a cais.config.MergeConfig (switch.merge); read: entries, line_bytes, timeout_us, latency_ns, lookups_per_ns,
    # red_accesses,
    # replacement
    def __new__(cls, host: Any, port: int, cfg: Any, gpus: int, spread: PortSpread | None = None) -> Self: ...
    def load(self, req: Train) -> None: ...
    def load_data(self, resp: Train) -> bool: ...
    def reduce(self, red: Train) -> None: ...
    def line_ps_until(self, end: int) -> int: ...
    def busy_ps_until(self, end: int) -> int: ...
    def stuck(self) -> list[str]: ...

@final
class Completion:
    left: int
    def __new__(cls, count: int, done: Callable[..., None] | None = None, region: Any = None, pieces: Any = None,
                 assemble: Callable[[Any, Any, dict[int, Any]], Any] | None = None) -> Self: ...
    def __call__(self, train: Any) -> None: ...

@final
class ArrivePerGpu:
    """A multicast flag's completion: each copy landing on GPU g arrives once on
    ``counts[g]``, in the core."""
    def __new__(cls, sim: Simulator, counts: list[Countdown]) -> Self: ...
    def __call__(self, train: Train) -> None: ...

@final
class SmPort:
    ps_per_byte: float
    free_at: int
    def __new__(cls, ps_per_byte: float) -> Self: ...
    def push(self, now: int, nbytes: int) -> tuple[int, int]: ...

@final
class TbDispatcher:
    """A GPU's TB dispatcher: places the TBs of launched kernels on free SMs and runs
    their programs (``tbs[i](sm, busy)``, a generator each)."""
    busy: int
    tbs_finished: int
    slowdown: float
    tb_log: list[tuple[str, int, int, int]] | None
    queued: int
    def __new__(cls, sim: Simulator, sms: int, hbm: Any = None, slowdown: float = 1.0) -> Self: ...
    def enqueue(self, kernel: Any, name: str, tbs: list[Callable[[int, int], Any]], sms: list[int] | None,
                priority: int, hbm_phases: bool, done: Signal, gates: list[int] | None = None,
                placed: Signal | None = None) -> int: ...
    def open(self, id: int, index: int) -> None: ...

@disjoint_base
class Signal:
    fired: bool
    value: Any
    time: int | None
    def __new__(cls) -> Self: ...
    def on_fire(self, fn: Callable[[Any], None]) -> None: ...
    def fire(self, sim: Simulator, value: Any = None) -> None: ...

@disjoint_base
class Countdown(Signal):
    remaining: int
    def __new__(cls, count: int) -> Self: ...
    def arrive(self, sim: Simulator, n: int = 1) -> None: ...

@final
class Bound:
    """At most ``limit`` bytes outstanding, granted first come, first served; strict: a
    request over the limit is refused. Not :class:`cais.kernels.common.Window` (a soft
    limit, one owner, no queue; its docstring has the difference)."""
    sim: Simulator
    limit: int
    used: int
    peak: int
    waited: int
    def __new__(cls, sim: Simulator, limit: int) -> Self: ...
    def acquire(self, nbytes: int) -> Signal | None: ...
    def release(self, nbytes: int) -> None: ...

@final
class TbPlan:
    def __new__(cls) -> Self: ...
    def wait(self, signal: Signal) -> None: ...
    def wait_sync(self, signal: Signal) -> None: ...
    def sleep(self, ps: int) -> None: ...
    def phase(self, phase: Any) -> None: ...
    def begin(self, unit: Any, a: int = 0, b: int = 0, c: int = 0) -> None: ...
    def call(self, fn: Callable[[], Any]) -> None: ...
    def mark(self) -> None: ...
    def rest(self, num: int, den: int) -> None: ...
    def __len__(self) -> int: ...

@final
class Process:
    sim: Simulator
    done: Signal | None  # None for a TB program the dispatcher runs (it is told when it ends)
    def __new__(cls, sim: Simulator, gen: Any, start: bool = True, hbm: HbmShare | None = None,
                 slowdown: float = 1.0) -> Self: ...
