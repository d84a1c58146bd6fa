"""The staged NVLS AllReduce (kernels/nvls_staged.py): NCCL's pipeline through its own
multicast buffers, as nccl-tests runs it on unregistered buffers (issue 22)."""

from __future__ import annotations

import pytest

from cais.experiments.collective import run_collective
from cais.config import apply_overrides, load_system
from cais.kernels.nvls_staged import chunk_bytes

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def _cfg(buffers: str, gpus: int = 8, **sets: str):
    return apply_overrides(load_system("dgx-h100", gpus=gpus), {"collective.nvls_buffers": buffers, **sets})


def test_chunk_follows_nccls_size_schedule() -> None:
    # 16 channels x 8 heads: 128 KiB from 1 GiB, 64 KiB from 64 MiB, 32 KiB from 8 MiB, else 16 KiB
    got = {s: chunk_bytes(s, 16, 8, 128 * KIB) // KIB for s in (8 * GIB, GIB, GIB - 2, 64 * MIB, 8 * MIB, 2 * MIB, 8)}
    assert got == {8 * GIB: 128, GIB: 128, GIB - 2: 64, 64 * MIB: 64, 8 * MIB: 32, 2 * MIB: 16, 8: 16}
    assert chunk_bytes(GIB, 16, 8, 64 * KIB) == 64 * KIB  # NCCL_NVLS_CHUNKSIZE caps it


@pytest.mark.parametrize("gpus,nbytes", [(4, 3 * 40_000 * 2), (8, 1 << 20)])
def test_staged_allreduce_gives_the_sums_and_conserves_bytes(gpus: int, nbytes: int) -> None:
    r = run_collective(_cfg("staged", gpus), "allreduce", "nvls", nbytes, functional=True)
    assert r.nvls_buffers == "staged" and r.correct
    c = r.conservation
    assert c.injected == c.delivered + c.absorbed - c.created


def test_staging_costs_time_the_zero_copy_kernel_does_not_pay() -> None:
    size = 4 * MIB  # 16 KiB chunks: two steps per channel
    reg = run_collective(_cfg("registered"), "allreduce", "nvls", size)
    staged = run_collective(_cfg("staged"), "allreduce", "nvls", size)
    assert reg.nvls_buffers == "registered" and staged.nvls_buffers == "staged"
    # the per-step polls, fences and counter stores are packets on the wire
    assert staged.events > reg.events
    # the fill (first scatter copy) and drain (last gather copy) are on the critical path
    assert staged.time_us > reg.time_us + 2 * (8 * 16 * KIB) / (18e9) * 1e6
    slow = run_collective(_cfg("staged", **{"collective.nvls_copy_GBps": "9"}), "allreduce", "nvls", size)
    assert slow.time_us > staged.time_us  # the copy rate is on the path taken


def test_staged_is_deterministic_and_mirror_agrees_with_full() -> None:
    cfg = _cfg("staged")
    a = run_collective(cfg, "allreduce", "nvls", 2 * MIB)
    b = run_collective(cfg, "allreduce", "nvls", 2 * MIB)
    assert (a.time_us, a.events) == (b.time_us, b.events)
    mirror = run_collective(cfg, "allreduce", "nvls", 2 * MIB, sim="mirror")
    # 0.01 with a VC per traffic class (docs/validation.md, "The fast path: mirror mode")
    assert mirror.time_us == pytest.approx(a.time_us, rel=0.025)


def test_only_allreduce_is_staged() -> None:
    r = run_collective(_cfg("staged"), "reducescatter", "nvls", 1 * MIB)
    assert r.nvls_buffers == "registered"  # NCCL's NVLS ReduceScatter/AllGather kernels are modelled zero-copy
    assert run_collective(_cfg("staged"), "allreduce", "ring", 1 * MIB).nvls_buffers is None


def test_a_layer_with_nccl_s_choice_runs_staged_nvls_exactly() -> None:
    """With collective.layer_choice = nccl a prefill layer's MB-sized AllReduces go
    NVLS, staged as NCCL runs them on unregistered buffers; the layer still
    reproduces the unsharded tensors, and takes longer than with zero-copy NVLS."""
    from cais.experiments.layer import run_layer
    from cais.workload.models import load_model

    model = load_model("paper-mega-gpt-4b").with_run(batch=1, seq=512)  # 3 MiB AllReduces: NCCL picks NVLS
    staged = _cfg("staged", 4, **{"collective.layer_choice": "nccl"})
    r = run_layer(staged, model, "tp-nvls", "prefill", functional=True, seed=3)
    assert r.checked > 0 and r.mismatches == []
    assert "nvls/simple" in r.as_json()["collectives"]["ran"]
    zero_copy = _cfg("registered", 4, **{"collective.layer_choice": "nccl"})
    assert run_layer(zero_copy, model, "tp-nvls", "prefill").total_us < run_layer(staged, model, "tp-nvls",
                                                                                   "prefill").total_us


def test_fences_and_multicast_flags_are_built_and_counted_in_the_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 40: Isa.fence has the core build and send its probes (Endpoint.fence_probes)
    and the staged kernel's tail and credit flags land on their countdowns through
    ArrivePerGpu, with no Python call per copy; the run is the one the Python path
    (a Train per probe, a callback per landed copy) gives, to the picosecond."""
    import cais.isa as isa_mod
    from cais.engine import ArrivePerGpu, Train
    from cais.hw.packets import Kind
    from cais.isa import FLAG_BYTES, Isa

    built: dict[str, int] = {"probes": 0, "counted": 0, "called": 0}

    def counting_train(*args, **kw):  # every Train the Python ISA builds
        t = Train(*args, **kw)
        if t.kind == Kind.FLAG:
            built["probes"] += 1
        elif t.kind == Kind.MC_FLAG:
            built["counted" if isinstance(t.done, ArrivePerGpu) else "called"] += 1
        return t

    monkeypatch.setattr(isa_mod, "Train", counting_train)
    cfg = _cfg("staged")
    size = 2 * MIB
    core = run_collective(cfg, "allreduce", "nvls", size, functional=True)
    assert core.correct
    assert built["probes"] == 0  # no fence probe built in Python
    assert built["counted"] > 0 and built["called"] == 0
    flags = built["counted"]

    def python_fence(self, src, dsts, traffic, done):  # the path before issue 40
        paths = [(d, c) for d in sorted(set(dsts)) if d != src for c in range(len(self.fab.switches))]
        if not paths:
            self._local(lambda: None, done)
            return
        acked = self._counter(len(paths), done)
        wire, last = self.pk.wire(Kind.FLAG, FLAG_BYTES)
        for d, c in paths:  # each on its destination's VC (the presets queue per destination)
            vc = self.vcmap.vc(Kind.FLAG, traffic, src=src, dst=d, n=self.n)
            probe = isa_mod.Train(0, wire, last, kind=Kind.FLAG, src=src, dst=d, chip=c, vc=vc, cls=traffic)
            probe.fence = acked
            self.fab.inject(probe)

    def python_counts(self, src, key, counts):
        self.flag_multicast(src, key, lambda g: counts[g].arrive(self.sim))

    monkeypatch.setattr(Isa, "fence", python_fence)
    monkeypatch.setattr(Isa, "flag_multicast_counts", python_counts)
    built.update(probes=0, counted=0, called=0)
    ref = run_collective(cfg, "allreduce", "nvls", size, functional=True)
    assert ref.correct
    assert built["probes"] > 0 and built["called"] == flags and built["counted"] == 0
    assert (core.time_us, core.events) == (ref.time_us, ref.events)
    assert core.metrics.as_json() == ref.metrics.as_json()


@pytest.mark.parametrize("limit", [None, 1], ids=["window", "one-piece-at-a-time"])
@pytest.mark.parametrize("functional", [False, True], ids=["timing", "functional"])
def test_the_reduce_warps_run_in_the_core_as_the_python_loop_did(monkeypatch: pytest.MonkeyPatch, limit: int | None,
                                                                 functional: bool) -> None:
    """Issue 40: a step's reduce warps (multimem.ld_reduce each piece within the window,
    multimem.st each sum as it comes back) run in the core (ReduceStream) with no
    Python call per piece, and give the run the Python loop they replaced gives, to
    the picosecond, the sums included. ``limit=1``: a window smaller than a piece, so
    each piece goes out alone, once nothing is in flight (the soft limit)."""
    import cais.isa as isa_mod
    from cais.engine import Countdown
    from cais.hw.memory import Region
    from cais.isa import Isa

    core_stream, real = Isa.ld_reduce_stream, isa_mod.ReduceStream
    streams: list[tuple[object, int]] = []  # each stream the core ran, and its pieces

    def counting(gpu, plan, *args):
        s = real(gpu, plan, *args)
        streams.append((s, len(plan)))
        return s

    def core(self, src, pieces, out, lim, port, stream=0, unit=None):
        return core_stream(self, src, pieces, out, limit or lim, port, stream, unit)

    got = [0]

    def python_loop(self, src, pieces, out, lim, port, stream=0, unit=None):  # the kernel's loop before
        lim = limit or lim
        state = {"used": 0, "next": 0}
        loaded = Countdown(len(pieces))

        def advance() -> None:
            while state["next"] < len(pieces):
                piece = pieces[state["next"]]
                if state["used"] > 0 and state["used"] + piece.nbytes > lim:
                    return  # a sum coming back resumes it
                state["used"] += piece.nbytes
                state["next"] += 1
                self.multimem_ld_reduce(src, piece, reduced(piece), stream, unit)

        def reduced(piece: Region):
            def back(data) -> None:
                got[0] += 1
                state["used"] -= piece.nbytes
                advance()
                self.multimem_st(src, Region(out, piece.start, piece.count, piece.elem_bytes), data, None, port,
                                 stream, unit)
                loaded.arrive(self.sim)
            return back

        advance()
        return loaded

    cfg, size = _cfg("staged"), 2 * MIB
    monkeypatch.setattr(isa_mod, "ReduceStream", counting)
    monkeypatch.setattr(Isa, "ld_reduce_stream", core)
    run = run_collective(cfg, "allreduce", "nvls", size, functional=functional)
    assert streams and sum(n for _, n in streams) > len(streams)  # several pieces a step
    assert all(s.next == n and s.used == 0 for s, n in streams)  # every piece went out and came back
    monkeypatch.setattr(Isa, "ld_reduce_stream", python_loop)
    ref = run_collective(cfg, "allreduce", "nvls", size, functional=functional)
    assert got[0] > len(streams)  # the Python loop ran, several pieces a step
    if functional:
        assert run.correct and ref.correct
    assert (run.time_us, run.events) == (ref.time_us, ref.events)
    assert run.metrics.as_json() == ref.metrics.as_json()
