"""The CAIS merge unit (hw/merge.py) against hand-computed outcomes, driven directly
through a stand-in switch: load and reduction merging with 2, 4 and 8 requesters,
LRU eviction and bypass, a late requester after eviction, a reduction evicted half
way, the idle timeout, a table that never holds more lines than it has, and the
replacement policies (LRU, FIFO) choosing different victims."""

from __future__ import annotations

import numpy as np
import pytest

from cais.engine import Simulator, Train
from cais.config import MergeConfig
from cais.hw.merge import LOAD_READY, LOAD_WAIT, REDUCTION, MergeUnit
from cais.hw.packets import Kind

LINE = 128
US = 1_000_000


class Host:
    """A stand-in switch: records what the unit asks of it."""

    def __init__(self) -> None:
        self.sim = Simulator()
        self.forwarded: list[Train] = []
        self.taken: list[tuple[Train, int]] = []
        self.answers: list[tuple[int, object, int, bool]] = []  # (requester, data, time, from the home's response)
        self.sums: list[tuple[str, int, object]] = []  # (address, count, data)

    def forward(self, train: Train) -> None:
        self.forwarded.append(train)

    def take(self, train: Train, absorbed: int) -> None:
        self.taken.append((train, absorbed))

    def answer(self, reqs, data, head, tail, source) -> None:
        for req in reqs:
            self.answers.append((req.src, data, self.sim.now, source is not None))

    def write_home(self, home, session, head, on_start) -> None:
        self.sums.append((session.addr, session.count, session.data))
        on_start(None, self.sim.now, self.sim.now)


def unit(requesters: int, entries: int = 320, timeout_us: float = 20.0) -> tuple[Host, MergeUnit]:
    host = Host()
    return host, MergeUnit(host, 0, MergeConfig(entries=entries, timeout_us=timeout_us), requesters + 1)


def load(src: int, addr: str, nbytes: int = LINE) -> Train:
    return Train(0, 32, 32, kind=Kind.LD_CAIS_REQ, src=src, dst=0, addr=addr, want=nbytes)


def red(src: int, addr: str, value: float, nbytes: int = LINE) -> Train:
    return Train(nbytes, nbytes + 32, nbytes + 32, kind=Kind.RED_CAIS, src=src, dst=0, addr=addr,
                 data=np.full(4, value), tag=7)


def at(host: Host, t_us: float, fn, *args) -> None:
    host.sim.at(round(t_us * US), fn, *args)


def home_data(host: Host, mu: MergeUnit, req: Train, data: object) -> None:
    resp = Train(LINE, LINE + 16, LINE + 16, kind=Kind.LD_CAIS_RESP, src=0, dst=req.src, addr=req.addr,
                 data=data, tag=req.tag)
    assert mu.load_data(resp)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_loads_from_k_requesters_reach_the_home_once(k: int) -> None:
    host, mu = unit(k)
    for i in range(k):  # requesters 1..k arrive 1 us apart; the home answers at 2.5 us
        at(host, 1.0 + i, mu.load, load(i + 1, "x"))
    at(host, 2.5, lambda: home_data(host, mu, host.forwarded[0], "data"))
    host.sim.run()
    assert len(host.forwarded) == 1 and host.forwarded[0].src == 1  # one request to the home
    assert sorted(src for src, *_ in host.answers) == list(range(1, k + 1))
    assert all(data == "data" for _, data, _, _ in host.answers)
    waited = [src for src, _, t, copied in host.answers if copied]
    assert waited == [1, 2]  # deferred: arrived before the data (1 us, 2 us); the rest from the cache
    st = mu.stats
    assert (st.merged, st.bypassed, st.evicted, st.timed_out, st.sessions) == (k - 1, 0, 0, 0, 1)
    assert mu.used == 0 and not mu.table  # the session ended at Count == k
    assert st.skew_max_ps == (k - 1) * US and st.peak_lines == 1


@pytest.mark.parametrize("k", [2, 4, 8])
def test_reductions_from_k_contributors_go_home_once_as_their_sum(k: int) -> None:
    host, mu = unit(k)
    for i in range(k):
        at(host, 1.0 + 0.5 * i, mu.reduce, red(i + 1, "y", float(i + 1)))
    host.sim.run()
    assert len(host.sums) == 1
    addr, count, data = host.sums[0]
    assert (addr, count) == ("y", k) and np.array_equal(data, np.full(4, k * (k + 1) / 2))
    assert [absorbed for _, absorbed in host.taken] == [LINE] * k and not host.forwarded
    assert mu.stats.merged == k - 1 and mu.used == 0


def test_a_late_requester_after_eviction_misses_and_bypasses_behind_a_load_wait_entry() -> None:
    host, mu = unit(2, entries=2)
    at(host, 1.0, mu.load, load(1, "x"))                              # X: Load-Wait, 1 line
    at(host, 1.5, lambda: home_data(host, mu, host.forwarded[0], "X"))  # X: Load-Ready, Count 1 of 2
    at(host, 2.0, mu.load, load(1, "y"))                              # Y: Load-Wait, table full
    at(host, 3.0, mu.load, load(1, "z"))                              # LRU X (Load-Ready) evicted for Z
    at(host, 4.0, mu.load, load(2, "x"))                              # late X: LRU is Y (Load-Wait): bypass
    host.sim.run(until=5 * US)
    st = mu.stats
    assert (st.evicted, st.bypassed, st.merged) == (1, 1, 0)
    assert [t.addr for t in host.forwarded] == ["x", "y", "z", "x"]
    assert host.forwarded[-1].tag == -1  # the bypassing request is not the unit's
    assert mu.table[(0, "y")].doomed and mu.used == 2
    assert set(s.state for s in mu.table.values()) == {LOAD_WAIT}
    assert [src for src, *_ in host.answers] == [1]


def test_a_reduction_evicted_half_way_reaches_home_as_partial_sums_with_their_counts() -> None:
    host, mu = unit(2, entries=1)
    at(host, 1.0, mu.reduce, red(1, "x", 1.0))  # X: Reduction, Count 1
    at(host, 2.0, mu.reduce, red(1, "y", 10.0))  # table full: X's partial goes home, Y takes its line
    at(host, 3.0, mu.reduce, red(2, "x", 2.0))  # X again: Y's partial goes home; X's new session is its last
    at(host, 4.0, mu.reduce, red(2, "y", 20.0))  # requester's, so the tracker ends it at once; and so on
    host.sim.run(until=10 * US)
    assert mu.stats.evicted == 2 and mu.stats.merged == 0
    # no session waits for the idle timer: the merge tracker knows each address is complete
    assert mu.stats.tracked == 2 and mu.stats.timed_out == 0 and not mu.table
    assert [(a, c, float(d[0])) for a, c, d in host.sums] == [("x", 1, 1.0), ("y", 1, 10.0), ("x", 1, 2.0),
                                                               ("y", 1, 20.0)]
    by_addr: dict[str, tuple[int, float]] = {}
    for a, c, d in host.sums:  # the home adds every partial: the totals are exact
        n0, s0 = by_addr.get(a, (0, 0.0))
        by_addr[a] = (n0 + c, s0 + float(d[0]))
    assert by_addr == {"x": (2, 3.0), "y": (2, 30.0)}


def test_the_idle_timer_flushes_sessions_whose_other_requesters_never_come() -> None:
    host, mu = unit(3, timeout_us=5.0)
    at(host, 1.0, mu.reduce, red(1, "r", 1.0))
    at(host, 3.0, mu.reduce, red(2, "r", 2.0))  # touched at 3 us: due at 8 us, not 6 us
    at(host, 1.0, mu.load, load(1, "l"))
    at(host, 2.0, lambda: home_data(host, mu, host.forwarded[0], "L"))  # Load-Ready at 2 us: due at 7 us
    host.sim.run(until=round(6.5 * US))
    assert mu.stats.timed_out == 0 and len(mu.table) == 2
    host.sim.run(until=round(7.5 * US))
    assert mu.stats.timed_out == 1 and list(mu.table) == [(1, "r")]
    host.sim.run()
    assert mu.stats.timed_out == 2 and not mu.table and mu.used == 0
    assert [(a, c, float(d[0])) for a, c, d in host.sums] == [("r", 2, 3.0)]
    assert host.sim.now == 8 * US


def test_a_zero_entry_table_lets_every_request_bypass() -> None:
    host, mu = unit(7, entries=0)
    for i in range(7):
        mu.load(load(i + 1, "x"))
        mu.reduce(red(i + 1, "y", 1.0))
    assert mu.stats.bypassed == 14 and mu.stats.sessions == 0 and len(host.forwarded) == 14


def test_a_table_full_of_load_wait_entries_never_grows() -> None:
    host, mu = unit(7, entries=8)
    for a in range(20):  # 20 addresses, 4 lines each, nobody answers
        mu.load(load(1, f"a{a}", 4 * LINE))
        assert mu.used <= 8
    assert mu.stats.peak_lines == 8 and mu.stats.sessions == 2 and mu.stats.bypassed == 18
    assert all(s.state == LOAD_WAIT for s in mu.table.values())


def test_a_request_larger_than_the_table_bypasses() -> None:
    host, mu = unit(7, entries=4)
    mu.reduce(red(1, "big", 1.0, nbytes=5 * LINE))
    assert mu.stats.bypassed == 1 and mu.used == 0


def test_load_ready_answers_come_from_the_cache_after_the_lookup_latency() -> None:
    host = Host()
    mu = MergeUnit(host, 0, MergeConfig(latency_ns=40.0), 3)
    mu.load(load(1, "x"))
    home_data(host, mu, host.forwarded[0], "X")
    assert mu.table[(0, "x")].state == LOAD_READY
    mu.load(load(2, "x"))
    assert host.answers[-1][:2] == (2, "X") and not host.answers[-1][3]


def _evicted_first(replacement: str | None) -> tuple[str, int]:
    """Two lines, three requesters: X opens, Y opens, X is accessed again, Z needs a
    line. The partial sum that goes home first is the evicted session's."""
    host = Host()
    cfg = MergeConfig(entries=2) if replacement is None else MergeConfig(entries=2, replacement=replacement)
    mu = MergeUnit(host, 0, cfg, 4)
    at(host, 1.0, mu.reduce, red(1, "x", 1.0))  # X opens
    at(host, 2.0, mu.reduce, red(1, "y", 10.0))  # Y opens: the table is full
    at(host, 3.0, mu.reduce, red(2, "x", 2.0))  # X accessed (Count 2 of 3): most recently used
    at(host, 4.0, mu.reduce, red(1, "z", 100.0))  # Z needs a line: the policy's victim goes home
    host.sim.run(until=5 * US)
    assert mu.stats.evicted == 1 and mu.replacement == (replacement or "lru")
    addr, count, _ = host.sums[0]
    return addr, count


def test_lru_evicts_the_session_accessed_longest_ago_and_fifo_the_one_opened_first() -> None:
    """switch.merge.replacement (rust/src/hw/replacement/): on the same accesses LRU
    sends Y's partial sum home (X was accessed after it) and FIFO sends X's (opened
    first), with the two contributions it holds; LRU is the default."""
    assert _evicted_first(None) == _evicted_first("lru") == ("y", 1)
    assert _evicted_first("fifo") == ("x", 2)


def test_a_system_file_may_leave_out_the_replacement_policy(tmp_path) -> None:
    """A knob added after the presets (cais.config.knob) may be left out of a file:
    the presets do not list switch.merge.replacement and get LRU; a file may set it."""
    import json

    from cais.config import load_system, missing_field

    cfg = load_system("dgx-h100")
    assert cfg.switch.merge.replacement == "lru"
    data = cfg.model_dump(mode="json")
    del data["switch"]["merge"]["replacement"]
    assert missing_field(data) is None
    del data["switch"]["merge"]["entries"]
    assert missing_field(data) == "switch.merge.entries"  # a field of before still must be given
    path = tmp_path / "fifo.json"
    path.write_text(json.dumps({"base": "dgx-h100", "switch": {"merge": {"replacement": "fifo"}}}))
    assert load_system(str(path)).switch.merge.replacement == "fifo"


def test_lookups_wait_for_the_units_next_free_slot() -> None:
    """switch.merge.lookups_per_ns: at 0.01 per ns one line's lookup takes 100 ns, so
    three one-line loads arriving together leave 0, 100 and 200 ns later; a two-line
    load takes two slots. Without a limit none waits; lookups are counted either way."""
    host = Host()
    mu = MergeUnit(host, 0, MergeConfig(lookups_per_ns=0.01), 3)
    for a in ("x", "y", "z"):
        mu.load(load(1, a))
    mu.load(load(1, "w", nbytes=2 * LINE))
    mu.load(load(1, "v"))
    assert [t.head for t in host.forwarded] == [0, 100_000, 200_000, 300_000, 500_000]
    assert mu.stats.lookups == 6 and mu.stats.lookup_wait_ps == 1_100_000 and mu.lookup_ps == 100_000
    host = Host()
    mu = MergeUnit(host, 0, MergeConfig(), 3)
    for a in ("x", "y"):
        mu.load(load(1, a))
    assert [t.head for t in host.forwarded] == [0, 0] and mu.stats.lookups == 2 and mu.stats.lookup_wait_ps == 0


def test_the_cacti_node_sets_the_lookup_latency_and_rate() -> None:
    from cais.cost.merge_unit import preset_timing

    cfg = MergeConfig(cacti_node="7nm")
    t = preset_timing("7nm")
    assert (cfg.latency_ns, cfg.lookups_per_ns) == (t["latency_ns"], t["lookups_per_ns"]) and cfg.lookups_per_ns > 1
