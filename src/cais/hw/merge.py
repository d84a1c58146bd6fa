"""The CAIS merge unit (paper §III-A.2-4): one per switch port, in the data path of
the requests whose home GPU is behind that port.

A CAM looks requests up by (address, type). Each hit or miss is a *session* in the
merging table, whose entries are 128 B lines (320 x 128 B = 40 KB per port by
default); the content array keeps the waiting requesters' metadata and the cached
load data. A session is ``Load-Wait`` (the first load went to the home GPU and its
data is not back), ``Load-Ready`` (the data is cached; later loads are answered from
it) or ``Reduction`` (partial sums being accumulated), and counts the requests
merged into it.

* Loads: the first ``ld.cais`` misses, allocates ``Load-Wait, Count = 1`` and goes to
  the home GPU; later ones wait (deferred response) or, once ``Load-Ready``, are
  answered from the cache. The session ends when ``Count`` reaches the number of
  requesters it expects (every GPU but the home: the home reads its own memory).
* Reductions: ``red.cais`` contributions are summed in the table; when all expected
  contributions are in, one reduction carrying their count goes to the home GPU.
* Eviction (LRU) when a new session needs lines and the table is full: a
  ``Load-Ready`` session is dropped; a ``Reduction`` session sends its partial sum
  home (the home accumulates: the write is an add); a ``Load-Wait`` session cannot
  go before its data is back, so it is released once the data has been handed out,
  and the arriving request bypasses the unit unmerged (no further eviction: no
  thrashing, no deadlock).
* Idle timeout: a session not accessed for ``timeout_us`` is flushed like an
  eviction, so a session whose other requesters never come (they merged into an
  earlier, evicted session) still completes.

Requests move as trains of whole packets (a transfer unit's share of one chip): a
session covers one train's address range and holds one line per 128 B of it; a
request merges with requests for exactly the same range (the ISA cuts every GPU's
accesses to one address alike). The table never holds more lines than it has: what
does not fit travels on unmerged through the switch's buffers and links, under
their credits.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

from cais.engine import Simulator, Train
from cais.hw.config import PS_PER_NS, PS_PER_US, MergeConfig
from cais.hw.memory import Region

LOAD_WAIT = "Load-Wait"
LOAD_READY = "Load-Ready"
REDUCTION = "Reduction"
_LOAD, _RED = 0, 1  # the CAM's request types


def _cam_key(kind: int, addr: Any) -> tuple:
    """The CAM key of a request: its type and address. A :class:`Region` is keyed by
    its fields (what its equality compares), which hash and compare in C rather
    than through the dataclass's Python ``__hash__``/``__eq__``."""
    if addr.__class__ is Region:
        return (kind, addr.buffer, addr.start, addr.count, addr.elem_bytes, addr.rows, addr.stride)
    return (kind, addr)


class MergeHost(Protocol):
    """What a merge unit needs from the switch chip it sits in."""

    sim: Simulator

    def forward(self, train: Train) -> None:
        """Send ``train`` on to its destination port unmerged (it keeps its input buffer
        until it leaves)."""

    def take(self, train: Train, absorbed: int) -> None:
        """``train`` is taken into the merge unit as it arrives: its input buffer frees
        now; ``absorbed`` payload bytes stay in the table."""

    def answer(self, reqs: list[Train], data: Any, head: int, tail: int, source: Train | None) -> None:
        """Send load data to each requester of ``reqs``: copies of the home's response
        ``source``, or (None) responses made from the cached data."""

    def write_home(self, home: int, session: "Session", head: int, on_start: Any) -> None:
        """Send a session's (partial) sum to its home GPU as one reduction."""


class Session:
    """One merging-table entry group: a CAM key, its state, its merge count and the
    content-array data (deferred requesters, cached load data or partial sum)."""

    __slots__ = ("id", "key", "state", "count", "expect", "quorum", "lines", "waiters", "held", "data", "addr",
                 "signal", "cls", "vc", "head", "touched", "doomed")

    def __init__(self, sid: int, key: tuple[int, Any], state: str, first: Train, lines: int, now: int,
                 expect: int) -> None:
        self.id = sid
        self.key = key
        self.state = state
        self.count = first.count
        self.expect = expect
        self.quorum = min(first.quorum, expect)
        self.lines = lines
        self.waiters: list[Train] = []  # loads waiting for the home's data
        self.held: list[Train] = []  # requests whose acknowledgement throttling holds back
        self.data: Any = None
        self.addr = first.addr
        self.signal = first.tag
        self.cls = first.cls
        self.vc = first.vc
        self.touched = now
        self.head = first.head
        self.doomed = False


class MergeStats:
    """What one merge unit did: requests merged into a session another opened, requests
    that bypassed it (``bypassed_loads`` of them loads), sessions evicted by LRU and
    flushed by the idle timer, sessions the merge tracker ended once every requester of
    their address had come (``tracked``: the rest went unmerged or to an evicted
    session), lines in use (peak, the integral over time, and the
    time it held any: ``busy_ps``), and the arrival skew per address: first to last
    of the requests one access expects (merged or not)."""

    __slots__ = ("merged", "bypassed", "bypassed_loads", "evicted", "timed_out", "tracked", "sessions",
                 "peak_lines", "line_ps", "busy_ps", "skew_n", "skew_sum_ps", "skew_max_ps")

    def __init__(self) -> None:
        self.merged = self.bypassed = self.bypassed_loads = self.evicted = self.timed_out = self.tracked = 0
        self.sessions = 0
        self.peak_lines = 0
        self.line_ps = self.busy_ps = 0
        self.skew_n = self.skew_sum_ps = self.skew_max_ps = 0


class PortSpread:
    """How the merge units of one switch chip share the work over time: the time any
    of them holds a session (``any_ps``) and the integral of how many do
    (``port_ps``); their ratio is the mean number of ports holding sessions while the
    chip holds any. A table that starves with few ports busy is concentrated: one
    home at a time takes every session."""

    __slots__ = ("active", "since", "any_ps", "port_ps")

    def __init__(self) -> None:
        self.active = 0
        self.since = 0
        self.any_ps = self.port_ps = 0

    def change(self, now: int, delta: int) -> None:
        """A port started (+1) or stopped (-1) holding sessions at ``now``."""
        if self.active:
            self.any_ps += now - self.since
            self.port_ps += self.active * (now - self.since)
        self.since = now
        self.active += delta

    def until(self, end: int) -> tuple[int, int]:
        """(``any_ps``, ``port_ps``) over [0, ``end``]."""
        tail = max(0, end - self.since) if self.active else 0
        return self.any_ps + tail, self.port_ps + self.active * tail


class MergeUnit:
    """The merge unit of switch port ``port``: it merges the mergeable requests whose
    home GPU is ``port`` and that the address hash sends to this chip."""

    def __init__(self, host: MergeHost, port: int, cfg: MergeConfig, gpus: int,
                 spread: PortSpread | None = None) -> None:
        self.host = host
        self.spread = spread if spread is not None else PortSpread()
        self.sim = host.sim
        self.port = port
        self.capacity = cfg.entries
        self.line_bytes = cfg.line_bytes
        self.timeout_ps = round(cfg.timeout_us * PS_PER_US)
        self.latency_ps = round(cfg.latency_ns * PS_PER_NS)
        self.default_expect = gpus - 1
        self.table: OrderedDict[tuple[int, Any], Session] = OrderedDict()  # the CAM, in LRU order
        self.by_id: dict[int, Session] = {}
        self.used = 0  # lines held (sessions, and sums waiting to leave)
        self._since = 0
        self._next = 0
        self._timer = False
        self._arrivals: dict[tuple[int, Any], list[int]] = {}  # address -> [first arrival, requests so far]
        self.stats = MergeStats()
        # lines held per tensor (the buffer a session's address is in), and their peaks:
        # which sub-layer's accesses need the table
        self.tensor_lines: dict[str, int] = {}
        self.tensor_peak: dict[str, int] = {}
        self.log: list[tuple[int, int]] | None = None  # (time, lines) at each change, when recording

    # ---- arrival skew ------------------------------------------------------------
    def _arrive(self, key: tuple[int, Any], req: Train) -> bool:
        """The merge tracker (paper section III-B.1: the switch "watches request arrival
        per group and per address"): count a request's arrival for its address, merged
        or not. Once all the requesters it expects have come, record first-to-last
        arrival (the paper's waiting time, Fig. 13(b)) and return True: no request for
        the address is still to come."""
        now = self.sim.now
        arrivals = self._arrivals
        seen = arrivals.get(key)
        if seen is None:
            seen = arrivals[key] = [now, req.count]
        else:
            seen[1] += req.count
        if seen[1] >= (req.expect or self.default_expect):
            del arrivals[key]
            st = self.stats
            skew = now - seen[0]
            st.skew_n += 1
            st.skew_sum_ps += skew
            if skew > st.skew_max_ps:
                st.skew_max_ps = skew
            return True
        return False

    def _last_arrived(self, key: tuple[int, Any]) -> None:
        """Every request for the address has arrived: a session still open for it
        (one opened after some of its requesters had merged into an evicted session,
        or bypassed) will get no more, so it ends now instead of at the idle timeout:
        a reduction sends its partial sum home, a cached load answers whom it holds,
        a load still waiting for its data ends when the data is back."""
        s = self.table.get(key)
        if s is None or s.count >= s.expect:  # none, or one about to end as usual (its data is on its way)
            return
        self.stats.tracked += 1
        if s.state == REDUCTION:
            self._flush(s)
        elif s.state == LOAD_READY:
            self._close(s)
        else:
            s.expect = s.quorum = s.count

    # ---- loads -------------------------------------------------------------------
    def load(self, req: Train) -> None:
        """An ``ld.cais`` request for ``req.want`` bytes of the home's memory arrives."""
        key = _cam_key(_LOAD, req.addr)
        last = self._arrive(key, req)
        self._load(key, req)
        if last:
            self._last_arrived(key)

    def _load(self, key: tuple[int, Any], req: Train) -> None:
        now = self.sim.now
        s = self.table.get(key)
        if s is None:
            s = self._open(key, LOAD_WAIT, req, max(1, -(-req.want // self.line_bytes)))
            if s is None:
                return
            s.waiters.append(req)
            req.tag = s.id
            self.host.forward(req)  # the standard routing path to the home GPU
            self._touch(s)
            return
        s.count += 1  # a hit
        self.stats.merged += 1
        self.host.take(req, 0)
        if s.state == LOAD_WAIT:
            s.waiters.append(req)  # deferred response
        else:
            s.held.append(req)
            if s.count >= s.quorum:
                self._answer_held(s, now)
            if s.count >= s.expect:
                self._close(s)
                return
        self._touch(s)

    def load_data(self, resp: Train) -> bool:
        """The home GPU's data for session ``resp.tag`` arrives: answer every waiting
        requester, then cache it (or end the session). False: no such session (the
        response is not the unit's)."""
        s = self.by_id.get(resp.tag)
        if s is None or s.state != LOAD_WAIT:
            return False
        s.state = LOAD_READY
        s.data = resp.data
        waiters, s.waiters = s.waiters, []
        if s.count >= s.quorum or s.doomed:
            self.host.answer(waiters, resp.data, resp.head + self.latency_ps, resp.tail + self.latency_ps, resp)
        else:  # throttled: the early requesters wait for their peers (answered from the cache)
            s.held.extend(waiters)
            self.host.take(resp, resp.payload)
        if s.count >= s.expect or s.doomed:
            self._close(s)
        else:
            self._touch(s)
        return True

    # ---- reductions --------------------------------------------------------------
    def reduce(self, red: Train) -> None:
        """A ``red.cais`` contribution (or a sum of ``red.count``) arrives."""
        key = _cam_key(_RED, red.addr)
        last = self._arrive(key, red)
        self._reduce(key, red)
        if last:
            self._last_arrived(key)

    def _reduce(self, key: tuple[int, Any], red: Train) -> None:
        s = self.table.get(key)
        if s is None:
            s = self._open(key, REDUCTION, red, self._lines(red.payload))
            if s is None:
                return
            s.data = None if red.data is None else red.data.copy()
        else:
            self._hit(s, red)
            s.count += red.count - 1
            if red.data is not None:
                s.data = red.data.copy() if s.data is None else s.data + red.data
        s.head = max(s.head, red.head)
        self.host.take(red, red.payload)
        s.held.append(red)  # accepted: the contributor's store window frees (throttled: once peers are in)
        if s.count >= s.quorum:
            self._ack_held(s)
        if s.count >= s.expect:
            self._flush(s)
        else:
            self._touch(s)

    # ---- the table -----------------------------------------------------------------
    def _lines(self, nbytes: int) -> int:
        return max(1, -(-nbytes // self.line_bytes))

    def _open(self, key: tuple[int, Any], state: str, first: Train, lines: int) -> Session | None:
        """A new session for ``first`` (a CAM miss), making room by LRU eviction; None
        (and ``first`` forwarded unmerged) when it cannot have the lines."""
        if not self._make_room(lines):
            self.stats.bypassed += 1
            if state == LOAD_WAIT:
                self.stats.bypassed_loads += 1
            self.host.forward(first)
            return None
        sid = self._next
        self._next += 1
        s = Session(sid, key, state, first, lines, self.sim.now, first.expect or self.default_expect)
        self.table[key] = s
        self.by_id[sid] = s
        self.stats.sessions += 1
        self._occupy(lines, s.addr)
        return s

    def _make_room(self, lines: int) -> bool:
        if lines > self.capacity:
            return False
        while self.capacity - self.used < lines:
            victim = next(iter(self.table.values()), None)
            if victim is None:  # the lines are held by sums waiting to leave
                return False
            if victim.state == LOAD_WAIT:  # released once its data is out; this request bypasses
                victim.doomed = True
                return False
            self.stats.evicted += 1
            self._flush(victim)
        return True

    def _hit(self, s: Session, req: Train) -> None:
        s.count += 1
        self.stats.merged += 1

    def _answer_held(self, s: Session, now: int) -> None:
        held, s.held = s.held, []
        if held:
            t = now + self.latency_ps
            self.host.answer(held, s.data, t, t, None)

    @staticmethod
    def _ack_held(s: Session) -> None:
        held, s.held = s.held, []
        for red in held:
            if red.done is not None:
                red.done(red)

    def _flush(self, s: Session) -> None:
        """End a session: a Reduction sends its (partial) sum home, its lines free when
        that leaves; a load session just frees its lines. Requests throttling held
        back are acknowledged."""
        if s.state != REDUCTION:
            self._close(s)
            return
        self._ack_held(s)
        self._forget(s)
        self.host.write_home(self.port, s, s.head + self.latency_ps, lambda *_a: self._occupy(-s.lines, s.addr))

    def _close(self, s: Session) -> None:
        self._answer_held(s, self.sim.now)
        self._forget(s)
        self._occupy(-s.lines, s.addr)

    def _forget(self, s: Session) -> None:
        del self.table[s.key]
        del self.by_id[s.id]

    def _occupy(self, lines: int, addr: Any) -> None:
        tensor = getattr(addr, "buffer", "")
        held = self.tensor_lines.get(tensor, 0) + lines
        self.tensor_lines[tensor] = held
        if held > self.tensor_peak.get(tensor, 0):
            self.tensor_peak[tensor] = held
        now = self.sim.now
        st = self.stats
        st.line_ps += self.used * (now - self._since)
        was = self.used
        if was:
            st.busy_ps += now - self._since
        self._since = now
        self.used += lines
        if not was and self.used:
            self.spread.change(now, 1)
        elif was and not self.used:
            self.spread.change(now, -1)
        st.peak_lines = max(st.peak_lines, self.used)
        if self.log is not None:
            self.log.append((now, self.used))

    # ---- idle timeout ----------------------------------------------------------------
    def _touch(self, s: Session) -> None:
        """An access: ``s`` becomes the most recently used (the CAM's LRU order is the
        order of last access, so the idle timer need only look at the front)."""
        sim = self.sim
        s.touched = sim.now
        self.table.move_to_end(s.key)
        if not self._timer:
            self._timer = True
            sim.at(sim.now + self.timeout_ps, self._expire)

    def _expire(self) -> None:
        """The unit's idle timer: flush every session idle for ``timeout_us`` (a
        Load-Wait session waits for its data, which touches it), then re-arm for the
        next one due."""
        self._timer = False
        now, limit = self.sim.now, self.timeout_ps
        due = []
        for s in self.table.values():
            if s.touched + limit > now:
                break
            if s.state != LOAD_WAIT:
                due.append(s)
        for s in due:
            self.stats.timed_out += 1
            self._flush(s)
        nxt = next((s.touched + limit for s in self.table.values() if s.state != LOAD_WAIT), None)
        if nxt is not None:
            self._timer = True
            self.sim.at(max(nxt, now), self._expire)

    def line_ps_until(self, end: int) -> int:
        """The integral of lines in use over [0, ``end``] (line-picoseconds)."""
        return self.stats.line_ps + self.used * max(0, end - self._since)

    def busy_ps_until(self, end: int) -> int:
        """The time in [0, ``end``] the unit held any line."""
        return self.stats.busy_ps + (max(0, end - self._since) if self.used else 0)

    def stuck(self) -> list[str]:
        """Sessions still open (for the forward-progress watchdog)."""
        waiting = sum(1 for s in self.table.values() if s.state == LOAD_WAIT)
        if not waiting:
            return []
        return [f"merge unit port {self.port}: {waiting} Load-Wait session(s) waiting for home data"]
