"""Issue 40: what the core executes for the kernels, checked on its own terms.

* A tile's planned loads (:class:`LoadPlan`) and epilogue (:class:`RedPlan`) are built
  once and shared by the GPUs that run the tile (and, for loads, by the tiles that read
  the same operand blocks); a GPU's stream skips its own rows.
* The TB dispatcher (:class:`TbDispatcher`) places TBs lowest free SM first, within a
  kernel's SM set, a higher priority first, launch order among equals, and frees an
  SM when its TB's program returns.
* A TB's plan (:class:`TbPlan`) runs exactly as the generator it lists, and the remote
  GEMMs' TBs are plans in both modes.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cais._core import LoadPlan, RedPlan, ReduceTbs, Region, Signal, Simulator, TbDispatcher, TbPlan
from cais.engine.sim import ProgramGen
from cais.experiments.layer import run_layer
from cais.config import apply_overrides, load_system
from cais.kernels import remote_gemm
from cais.workload.models import load_model


def _region(start: int, count: int = 1024) -> Region:
    return Region("x", start, count, 2)


def test_a_load_plan_counts_what_each_gpu_issues() -> None:
    stripes = [[(_region(0, 512), 0), (_region(512, 512), 1)], [(_region(2048), 0)], [(_region(4096), 1)]]
    plan = LoadPlan([(0, _region(0), stripes[0], None), (1, _region(2048), stripes[1], None),
                     (2, _region(4096), stripes[2], None)])
    assert len(plan) == 3
    assert plan.loads() == 3 and plan.stripes() == 4
    assert plan.loads(0) == 2 and plan.stripes(0) == 2  # GPU 0 reads its own rows locally
    assert plan.loads(1) == 2 and plan.stripes(1) == 3
    assert plan.loads(5) == 3


def test_a_load_plan_cut_in_the_core_is_the_plan_cut_in_python() -> None:
    """``LoadPlan.cut`` (timing mode) cuts a tile's loads as the Python path does:
    request pieces of the interleave, each striped into its trains; ``chain`` puts the
    steps of a mainloop one after the other."""
    from cais._core import Interleave
    from cais.kernels.remote_gemm import Load

    il = Interleave([0, 0, 1, 1, 2, 2, 3, 3], 256)
    block = Region("x", 96, 300, 2, 5, 1024)  # 5 rows of 600 B: pieces of whole rows
    run = Region("y", 40, 5000, 2)  # a run over rows, cut at 4 KiB boundaries
    loads = [Load(0, 1, block, 0, 0, 5, 300), Load(1, 0, run, 0, 0, 1, 5000), Load(0, 2, run, 0, 0, 1, 5000)]
    by_hand = [(ld.home, pc, il.trains(pc, 1024)) for ld in loads for pc in il.pieces(ld.region, 4096)]
    plan = LoadPlan.cut(il, loads, 4096, 1024)
    assert len(plan) == len(by_hand) > len(loads)
    assert plan.loads() == len(by_hand) and plan.stripes() == sum(len(st) for _, _, st in by_hand)
    assert plan.loads(0) == sum(1 for home, _, _ in by_hand if home != 0)
    assert plan.stripes(1) == sum(len(st) for home, _, st in by_hand if home != 1)
    mine = LoadPlan.cut(il, loads, 4096, 1024, skip=0)  # mirror mode: GPU 0's own loads left out
    assert len(mine) == plan.loads(0)
    both = LoadPlan.chain([plan, mine])
    assert len(both) == len(plan) + len(mine) and both.stripes() == plan.stripes() + mine.stripes()


def test_a_tiles_loads_walked_in_the_core_are_its_operands_blocks_on_their_owners() -> None:
    """``LoadPlan.tile_loads`` lists a load GEMM tile's K steps as the operands' stored
    blocks on their owners (an A^T operand, K over tokens; a B operand, K over columns),
    split where an owner's rows end, with where each goes in the tile's block; and
    ``cut_steps`` is ``cut`` of each step."""
    from cais._core import Interleave

    rows_l, cols, eb = 96, 512, 2
    operands = [(True, "x", rows_l, cols, 64, 128), (False, "y", rows_l, cols, 150, 70)]
    steps = [(0, 64), (64, 64), (128, 100)]
    want = []
    for k0, kk in steps:  # the stored block, then its owners' parts, as by hand
        loads = []
        for o, (tokens_k, shard, _, _, s0, sn) in enumerate(operands):
            t0, nt, c0, nc = (k0, kk, s0, sn) if tokens_k else (s0, sn, k0, kk)
            base_t, base_c = (0, s0) if tokens_k else (s0, 0)
            for t in range(t0, t0 + nt):  # row by row, a new load where the owner changes
                owner = t // rows_l
                if loads and tuple(loads[-1][:2]) == (o, owner):
                    loads[-1][5] += 1
                else:
                    loads.append([o, owner, shard, t - owner * rows_l, t - base_t, 1, c0, nc, c0 - base_c])
        want.append([(o, owner, Region.block(shard, cols, r0, n, c0, nc, eb), row, col, n, nc)
                     for o, owner, shard, r0, row, n, c0, nc, col in loads])
    got = LoadPlan.tile_loads(operands, steps, eb)
    assert got == want and sum(len(step) for step in got) > len(steps) * len(operands)  # some split at owners
    il = Interleave([0, 0, 1, 1, 2, 2, 3, 3], 256)
    for skip in (None, 1):
        cut = LoadPlan.cut_steps(il, operands, steps, eb, 4096, 1024, skip)
        by_hand = [LoadPlan.cut(il, step, 4096, 1024, skip) for step in got]
        assert [(len(p), p.stripes()) for p in cut] == [(len(p), p.stripes()) for p in by_hand]


def test_a_red_plan_names_the_owners_a_gpu_sends_to() -> None:
    from cais._core import Interleave, RedForm

    il = Interleave([0, 0, 1, 1, 2, 2, 3, 3], 256)
    blocks = [(1, _region(0)), (0, _region(2048)), (1, _region(4096)), (2, _region(8192))]
    plan = RedPlan.build(il, RedForm(3, 1024), blocks, 1024)
    assert plan.owners(0) == [1, 2]
    assert plan.owners(1) == [0, 2]
    trains = [len(il.trains(region, 1024)) for _, region in blocks]
    assert plan.stripes(0) == trains[0] + trains[2] + trains[3]  # two blocks for GPU 1, one for GPU 2
    assert plan.stripes(1) == trains[1] + trains[3]
    mirror = RedPlan.build(il, RedForm(3, 1024), blocks, 1024, skip=0)  # GPU 0 alone runs it
    assert mirror.stripes(1) == trains[3]  # the block owned by 0 was planned with no pieces


def test_the_cores_row_block_cut_is_the_passs() -> None:
    """``RowBlocks.cut`` (the epilogue's cut at LN row blocks, made in the core) cuts an
    owner's rows where the pass's ``TbDependencies.cut`` does, for 2-D blocks and for
    runs that start or end mid-row, and says where each part's data starts."""
    from types import SimpleNamespace

    from cais._core import RowBlocks
    from cais.opt.tb_dependencies import TbDependencies

    width, rows_l, per = 64, 96, 40
    rb = RowBlocks(width, rows_l, per, [100 + b for b in range(3)])
    seen = 0
    for owner in (0, 2):
        for r0, rows in ((0, 96), (5, 50), (39, 2), (80, 16)):
            want = TbDependencies.cut(SimpleNamespace(rows_l=rows_l, block_rows=per), owner, r0, rows)
            block = Region.block("t", width, r0, rows, 8, 24, 2)  # a 2-D block of part of each row
            got = rb.cut(block, owner)
            assert [(b, sub.start // width, sub.rows) for b, sub, _ in got] == [(b, t, n) for b, t, n in want]
            assert [off for _, _, off in got] == [(t - r0) * 24 for _, t, _ in want]
            seen += len(got)
    run = Region("t", 70 * width + 10, 3 * width, 2)  # from mid-row 70 over rows 71 and 72 into 73
    got = rb.cut(run, 1)
    assert [(b, sub.start, sub.count, off) for b, sub, off in got] == [
        (1, 70 * width + 10, width - 10, 0), (1, 71 * width, 2 * width, width - 10),
        (1, 73 * width, 10, 3 * width - 10)]
    assert seen > 8


def test_a_red_plan_made_in_the_core_is_the_plan_made_in_python() -> None:
    """``RedPlan.build`` (timing mode) makes an epilogue's pieces and reductions as the
    Python path cuts them (``RemoteAccess.reductions``), and its own block raises the
    signal words ``add_own`` would: plain ``red``, ``red.cais`` into one word, and
    ``red.cais`` cut at LN row blocks."""
    from cais._core import Interleave, RedForm, RowBlocks

    il = Interleave([0, 0, 1, 1, 2, 2, 3, 3], 256)
    width, rows_l, per = 512, 64, 16
    rb = RowBlocks(width, rows_l, per, [7, 8, 9, 10])
    block = Region.block("o", width, 10, 20, 128, 256, 2)  # rows 10-29 of owner 1's shard
    forms = [(RedForm(3, 1024), lambda pc: [(3, 1, pc, -1, 0)], []),
             (RedForm(15, 1024, 4, 2), lambda pc: [(15, 1, pc, 4, 2)], [(4, block.nbytes)]),
             (RedForm(15, 1024, quorum=2, blocks=rb),
              lambda pc: [(15, 1, sub, 7 + b, 2) for b, sub, _ in rb.cut(pc, 1)],
              [(7 + b, sub.nbytes) for b, sub, _ in rb.cut(block, 1)])]
    # a tile's plan over rows of two owners is the plan of its two blocks
    tile = RedPlan.tile(il, forms[1][0], ("o", rows_l, width), (50, 30), (128, 256), 2, 4096)
    halves = [(0, Region.block("o", width, 50, 14, 128, 256, 2)), (1, Region.block("o", width, 0, 16, 128, 256, 2))]
    both = RedPlan.build(il, forms[1][0], halves, 4096)
    assert tile.owners(2) == [0, 1] and tile.pieces(2) == both.pieces(2) and tile.own_signals(1) == both.own_signals(1)
    for form, reds, own in forms:
        plan = RedPlan.build(il, form, [(1, block)], 4096)
        by_hand = [(pc.nbytes, [(kind, dst, il.trains(sub, 1024), tag, q) for kind, dst, sub, tag, q in reds(pc)])
                   for pc in il.pieces(block, 4096)]
        assert len(by_hand) > 1 and plan.pieces(0) == by_hand
        assert plan.owners(0) == [1] and plan.pieces(1) == []
        assert plan.own_signals(1) == own and plan.own_signals(0) == []


def _counting(cls: Any, made: list[int]) -> Any:
    def make(*args: Any) -> Any:
        made[0] += 1
        return cls(*args)
    return make


@pytest.mark.parametrize("mode", ["prefill", "train"])
def test_the_gpus_of_a_layer_share_their_tiles_plans(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    loads, reds = [0], [0]
    # a tile's loads are its steps' plans chained from its first step round (timing mode)
    monkeypatch.setattr(remote_gemm, "LoadPlan", SimpleNamespace(cut_steps=LoadPlan.cut_steps,
                                                                 chain=_counting(LoadPlan.chain, loads)))
    factories: list[Any] = []

    def reduce_tbs(*args: Any) -> Any:  # the GEMM-RS factories, whose tile plans the core makes
        factories.append(ReduceTbs(*args))
        return factories[-1]
    monkeypatch.setattr(remote_gemm, "ReduceTbs", reduce_tbs)
    # the GEMMs' own remote loads (staged reads; a copy engine would load for them)
    cfg = apply_overrides(load_system("dgx-h100"), {"gpus": "4", "remote_read.strategy": "staged"})
    r = run_layer(cfg, load_model("paper-mega-gpt-4b").with_run(1, 512), "cais", mode, 32)
    tbs = sum(g["tbs"] for g in r.as_json()["hbm"]["per_gpu"].values())
    reds[0] = sum(f.plans_made for f in factories)
    assert loads[0] > 0 and reds[0] > 0, "the shared plans were not taken"
    # every tile's plan serves its 4 GPUs: at most a quarter of the TBs build one
    assert 4 * (loads[0] + reds[0]) <= tbs


def _program(sim: Simulator, delay: int) -> Any:
    def tb(sm: int, busy: int) -> ProgramGen:
        yield delay
    return tb


def test_the_dispatcher_places_tbs_by_priority_within_sm_sets() -> None:
    sim = Simulator()
    d = TbDispatcher(sim, 4)
    d.tb_log = []
    low = SimpleNamespace(started_at=None, finished_at=None)
    high = SimpleNamespace(started_at=None, finished_at=None)
    low_done, high_done = Signal(), Signal()
    d.enqueue(low, "low", [_program(sim, 100)] * 6, None, 0, False, low_done)
    d.enqueue(high, "high", [_program(sim, 50)] * 2, [2, 3], 5, False, high_done)
    assert d.queued == 2
    sim.run()
    log = sorted(d.tb_log)
    # at t = 0 the high-priority kernel takes its two SMs (2, 3) first; the low one
    # gets SMs 0 and 1, then 2 and 3 when the high one's TBs end at 50
    assert [e for e in log if e[0] == "high"] == [("high", 2, 0, 50), ("high", 3, 0, 50)]
    low_runs = sorted((start, sm) for _, sm, start, _ in (e for e in log if e[0] == "low"))
    assert low_runs == [(0, 0), (0, 1), (50, 2), (50, 3), (100, 0), (100, 1)]
    assert (high.started_at, high.finished_at, low.started_at, low.finished_at) == (0, 50, 0, 200)
    assert high_done.fired and low_done.fired
    assert d.busy == 0 and d.tbs_finished == 8 and d.queued == 0


def _tb_steps(sim: Simulator, sig: Signal, port: Any, log: list[int]) -> tuple[ProgramGen, TbPlan]:
    """One TB's control flow twice: as a generator, and as the plan that lists it."""
    from cais.hw.hbm import HbmPhase

    def program() -> ProgramGen:
        yield sig
        start = sim.now
        compute = yield HbmPhase(1000, 1500.0, overlapped=True)
        yield 50
        log.append(sim.now)
        if port.free_at > sim.now:
            yield port.free_at - sim.now
        end = max(start + compute, sim.now + compute * 64 // 1000)
        if end > sim.now:
            yield end - sim.now
        yield HbmPhase(400, 100.0)

    plan = TbPlan()
    plan.wait(sig)
    plan.mark()
    plan.phase(HbmPhase(1000, 1500.0, overlapped=True))
    plan.sleep(50)
    plan.call(lambda: log.append(sim.now))
    plan.begin(port)
    plan.rest(64, 1000)
    plan.phase(HbmPhase(400, 100.0))
    return program(), plan


@pytest.mark.parametrize("slowdown", [1.0, 2.0])
def test_a_tb_plan_runs_exactly_as_the_generator_it_lists(slowdown: float) -> None:
    """Every kind of step (a wait, a phase the TB times itself and one it sleeps, a
    sleep, a call, an SM port's push, the mainloop's rest) gives the generator's times
    and events, on a GPU slowed or not."""
    from cais.engine import Process
    from cais.hw.hbm import HbmShare
    from cais.isa import SmPort

    seen = []
    for as_plan in (False, True):
        sim = Simulator()
        share = HbmShare(bytes_per_ps=1.0, window_ps=1000)
        sig, port, log = Signal(), SmPort(1.0), []
        port.free_at = 9_000
        gen, plan = _tb_steps(sim, sig, port, log)
        proc = Process(sim, plan if as_plan else gen, hbm=share, slowdown=slowdown)
        sim.at(300, sig.fire, sim)
        sim.run()
        assert proc.done.fired
        seen.append((log, proc.done.time, sim.events, share.phases))
        if as_plan:
            assert len(plan) == 0  # the process took its steps
    assert seen[0] == seen[1]
    log, end, _, phases = seen[1]
    assert phases == 2 and log[0] > 300 and end > 9_000  # it waited, its phases were timed, the port held it


def test_a_tb_plan_runs_once_and_refuses_what_it_cannot_run() -> None:
    from cais.engine import Process
    from cais.hw.hbm import HbmPhase, HbmShare

    sim = Simulator()
    plan = TbPlan()
    plan.sleep(10)
    Process(sim, plan)
    with pytest.raises(RuntimeError, match="a TB plan runs once"):
        Process(sim, plan)
    with pytest.raises(RuntimeError, match="takes no more steps"):
        plan.sleep(5)
    with pytest.raises(ValueError, match="num >= 0 over den > 0, got 1/0"):
        TbPlan().rest(1, 0)
    with pytest.raises(TypeError, match="expected a unit a TB plan can begin"):
        TbPlan().begin(object())
    with pytest.raises(TypeError, match="a TB plan cannot begin a HbmShare"):
        bad = TbPlan()
        bad.begin(HbmShare(bytes_per_ps=1.0, window_ps=1000))  # a unit, but not one a plan starts
        Process(sim, bad)
        sim.run()
    phased = TbPlan()
    phased.phase(HbmPhase(10, 1.0))
    Process(sim, phased)
    with pytest.raises(TypeError, match="needs a kernel with hbm_phases"):
        sim.run()


@pytest.mark.parametrize("functional", [False, True])
def test_a_cais_layers_remote_gemm_tbs_run_as_plans(monkeypatch: pytest.MonkeyPatch, functional: bool) -> None:
    """The GEMM-RS and AG-GEMM TBs of CAIS (and LADM) are plans in both modes, so the
    core runs them without resuming Python; functional mode still reproduces the
    layer's tensors."""
    made: list[str] = []

    def recording(build: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = build(*args, **kwargs)
            kernel = out[0] if isinstance(out, tuple) else out
            tbs = kernel.tbs

            def tb(f: Any) -> Any:
                def make(sm: int, busy: int) -> Any:
                    program = f(sm, busy)
                    made.append(type(program).__name__)
                    return program
                return make
            kernel.tbs = [tb(f) for f in tbs]
            return out
        return wrapped

    monkeypatch.setattr(remote_gemm, "reduce_gemm", recording(remote_gemm.reduce_gemm))
    monkeypatch.setattr(remote_gemm, "load_gemm", recording(remote_gemm.load_gemm))
    from cais.workload.models import ModelSpec

    gpt = ModelSpec(name="tiny-gpt", family="gpt", hidden=256, ffn_hidden=512, heads=4, layers=2, gated_mlp=False,
                    norm="layernorm", activation="gelu", seq=64, batch=4)
    cfg = load_system("dgx-h100").with_overrides(gpus=4)
    for scheme in ("cais", "ladm"):
        before = len(made)
        r = run_layer(cfg, gpt, scheme, "prefill", functional=functional, seed=3)
        assert len(made) > before  # the path under test was taken
        if functional:
            assert r.mismatches == []
    assert set(made) == {"TbPlan"}


@pytest.mark.parametrize("scheme", ["cais", "ladm"])
@pytest.mark.parametrize("mode", ["prefill", "train"])
def test_the_cores_tb_factories_time_a_layer_as_pythons_plans_do(monkeypatch: pytest.MonkeyPatch, scheme: str,
                                                                  mode: str) -> None:
    """In timing mode the core makes the remote GEMMs' TB plans (``LoadTbs`` for the
    AG-GEMMs and weight gradients, ``ReduceTbs`` for the GEMM-RS); in functional mode
    Python makes them (``planned``), with the data. Both describe the same TBs, so the
    layer's simulated time and its events are the same in both modes."""
    from cais._core import LoadTbs, ReduceTbs
    from cais.workload.models import ModelSpec

    made = {"load": 0, "reduce": 0}

    def counted(cls: Any, name: str) -> Any:
        def make(*args: Any) -> Any:
            made[name] += 1
            return cls(*args)
        return make

    monkeypatch.setattr(remote_gemm, "LoadTbs", counted(LoadTbs, "load"))
    monkeypatch.setattr(remote_gemm, "ReduceTbs", counted(ReduceTbs, "reduce"))
    gpt = ModelSpec(name="tiny-gpt", family="gpt", hidden=256, ffn_hidden=512, heads=4, layers=2, gated_mlp=False,
                    norm="layernorm", activation="gelu", seq=64, batch=4)
    # the GEMMs' own remote loads (staged reads; with a copy engine the AG-GEMMs load nothing)
    cfg = apply_overrides(load_system("dgx-h100"), {"gpus": "4", "remote_read.strategy": "staged"})
    timed = run_layer(cfg, gpt, scheme, mode, functional=False, seed=3)
    assert made["load"] > 0 and made["reduce"] > 0  # the core's factories made the timing mode's TBs
    made.update(load=0, reduce=0)
    data = run_layer(cfg, gpt, scheme, mode, functional=True, seed=3)
    assert made == {"load": 0, "reduce": 0} and data.mismatches == []  # Python's, with the data
    assert (timed.total_us, timed.events) == (data.total_us, data.events)
    # the presets' copies (the as-sold rule: copy engine or comm SMs) time the same in both modes too
    copied = load_system("dgx-h100").with_overrides(gpus=4)
    assert copied.remote_read.strategy == "auto"
    timed, data = (run_layer(copied, gpt, scheme, mode, functional=f, seed=3) for f in (False, True))
    assert (timed.total_us, timed.events) == (data.total_us, data.events) and data.mismatches == []
