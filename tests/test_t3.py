"""T3 and T3-NVLS: the DMA engine, the chunk bookkeeping, dependencies that a
functional run with slow links would expose, and the overlap structure in timing
mode."""

import numpy as np
import pytest

import cais.experiments.layer as layer
from cais.engine import Signal
from cais.hw.compute import ComputeModel
from cais.machine import Machine
from cais.hw.memory import Region
from cais.kernels.gemm import GemmShape
from cais.schemes.base import LayerRun
from cais.kernels.dma import DmaCommand, DmaEngine, dma_rate_GBps, dma_window_bytes
from cais.schemes.t3 import T3, pieces_by_row, tile_order
from cais.schemes.t3_nvls import T3Nvls
from cais.workload.graph import build_period
from cais.workload.models import ModelSpec

GPT = ModelSpec(name="tiny-gpt", family="gpt", hidden=256, ffn_hidden=512, heads=4, layers=2, gated_mlp=False,
                norm="layernorm", activation="gelu", seq=64, batch=4)
MID = ModelSpec(name="mid-gpt", family="gpt", hidden=2048, ffn_hidden=8192, heads=16, layers=2, gated_mlp=False,
                norm="layernorm", activation="gelu", seq=1024, batch=4)


# ---- the DMA engine --------------------------------------------------------------------
def _engines(cfg, functional: bool) -> tuple[Machine, list[DmaEngine]]:
    m = Machine(cfg, functional=functional)
    return m, [DmaEngine(m, g, dma_rate_GBps(cfg), dma_window_bytes(cfg)) for g in range(m.n)]


def test_dma_store_of_a_chunk_is_link_limited(h100) -> None:
    m, dma = _engines(h100, functional=False)
    nbytes = 8 << 20
    done = Signal()
    region = Region("x", 0, nbytes // 2)
    dma[0].push(DmaCommand("st", region, region, m.cfg.unit_for(nbytes), peer=1, done=done))
    m.run()
    rate = nbytes / done.time * 1000  # GB/s
    assert 300 < rate < h100.link.bandwidth_GBps * h100.links_per_gpu


def test_copy_engine_rate_is_a_config_field(h100) -> None:
    """gpu.copy_engine.rate_GBps = 100 caps a chunk store at 100 GB/s (the links would
    give about 347)."""
    from cais.config import apply_overrides

    cfg = apply_overrides(h100, {"gpu.copy_engine.rate_GBps": "100"})
    m, dma = _engines(cfg, functional=False)
    nbytes = 8 << 20
    done = Signal()
    region = Region("x", 0, nbytes // 2)
    dma[0].push(DmaCommand("st", region, region, m.cfg.unit_for(nbytes), peer=1, done=done))
    m.run()
    assert 90 < nbytes / done.time * 1000 <= 100


def test_dma_pull_and_multicast_move_the_data(h100) -> None:
    cfg = h100.with_overrides(gpus=4)
    m, dma = _engines(cfg, functional=True)
    count = 3000
    rng = np.random.default_rng(0)
    parts = [rng.integers(-9, 9, count).astype(np.float64) for _ in range(4)]
    for gpu, x in zip(m.gpus, parts):
        gpu.memory.alloc("p", count, fill=x)
        gpu.memory.alloc("sum", count)
        gpu.memory.alloc("all", 4 * count)
    pulled = Signal()
    dma[2].push(DmaCommand("ld_reduce", Region("p", 0, count), Region("sum", 0, count), 1024, done=pulled))
    pulled.on_fire(lambda _v: dma[2].push(
        DmaCommand("mc_st", Region("sum", 0, count), Region("all", 2 * count, count), 1024)))
    m.run()
    total = np.sum(parts, axis=0)
    assert np.array_equal(m.gpus[2].memory.buffers["sum"], total)
    for gpu in m.gpus:
        assert np.array_equal(gpu.memory.buffers["all"][2 * count:3 * count], total)


# ---- chunk bookkeeping -----------------------------------------------------------------
def test_tile_rows_straddling_shards_are_split_and_ordered() -> None:
    shape = GemmShape(m=256, n=64, k=8, bm=96, bn=32)  # rows 0-95, 96-191, 192-255; shards of 64
    pieces = pieces_by_row(shape, 64)
    assert pieces == [[(0, 0, 64), (1, 64, 32)], [(1, 96, 32), (2, 128, 64)], [(3, 192, 64)]]
    rank = {0: 3, 1: 0, 2: 1, 3: 2}.get  # e.g. GPU 2's stages: chunk 1 first
    produce = [i for i, j in tile_order(shape, pieces, rank) if j == 0]
    consume = [i for i, j in tile_order(shape, pieces, rank, latest=True) if j == 0]
    assert produce == [0, 1, 2]  # row 0 feeds chunk 1 (stage 0)
    assert consume == [1, 2, 0]  # row 0 must wait for chunk 0 (last)


# ---- dependencies: slow links make any missing wait visible ----------------------------
@pytest.fixture(scope="module")
def slow_links(h100):
    cfg = h100.with_overrides(gpus=4)
    return cfg.with_overrides(link={**cfg.link.model_dump(), "bandwidth_GBps": 0.2})


class _NoTileWaits(T3):
    name = ""

    def gemm2_waiting(self, r, c, g, arrived, rank):
        return r.gemm_kernel(g, c.gemm2)


class _RowOpBeforeRs(T3Nvls):
    name = ""

    def gemm_rs(self, r, c, deps):
        _, g1 = super().gemm_rs(r, c, deps)
        return [g1[0]] * r.m.n, g1


class _Gemm2BeforeAg(T3Nvls):
    name = ""

    def nvls_allgather(self, r, src, dst, deps):
        super().nvls_allgather(r, src, dst, deps)
        return [deps[0]] * r.m.n


@pytest.mark.parametrize("mode", ["prefill", "train"])
@pytest.mark.parametrize("scheme", ["t3", "t3-nvls"])
def test_correct_with_slow_links(slow_links, scheme, mode) -> None:
    r = layer.run_layer(slow_links, GPT, scheme, mode, functional=True, seed=1)
    assert r.checked > 0 and r.mismatches == []


@pytest.mark.parametrize("broken", [_NoTileWaits, _RowOpBeforeRs, _Gemm2BeforeAg])
def test_a_missing_dependency_is_caught(slow_links, monkeypatch, broken) -> None:
    monkeypatch.setattr(layer, "get_scheme", lambda name: broken())
    r = layer.run_layer(slow_links, GPT, "t3", "prefill", functional=True, seed=1)
    assert r.mismatches


# ---- overlap structure in timing mode --------------------------------------------------
class _SpyT3(T3):
    name = ""

    def ring_allgather(self, r, src, dst, deps):
        arrived = super().ring_allgather(r, src, dst, deps)
        self.gathers.append(arrived)
        return arrived


class _SpyT3Nvls(T3Nvls):
    name = ""

    def gemm_rs(self, r, c, deps):
        rs_end, g1 = super().gemm_rs(r, c, deps)
        self.rs_ends.append(rs_end)
        return rs_end, g1

    def nvls_allgather(self, r, src, dst, deps):
        end = super().nvls_allgather(r, src, dst, deps)
        self.ag_ends.append(end)
        return end


def _run(h100, scheme) -> tuple[LayerRun, list[list[tuple[int, str]]]]:
    """Run a prefill period; also return, per GPU, (time, op) of every DMA command
    as it was triggered."""
    cfg = h100.with_overrides(gpu={**h100.gpu.model_dump(), "sms": 66})  # the paper's scaled-down GPU
    period = build_period(MID, cfg.gpus, "prefill", True)
    m = Machine(cfg)
    run = LayerRun(m, MID, period, ComputeModel.load(cfg.gpu.compute_model, cfg.gpu.hbm_bandwidth_GBps))
    scheme.run(run)
    pushed: list[list[tuple[int, str]]] = [[] for _ in range(m.n)]
    for g, engine in enumerate(scheme.dma):
        def push(cmd, g=g, orig=engine.push):
            pushed[g].append((m.sim.now, cmd.op))
            orig(cmd)
        engine.push = push
    m.run()
    return run, pushed


def _kernels(run: LayerRun, chain: str, name: str) -> list:
    return [k for seg, _, k in run.kernels if seg == chain and k.name == name]


def test_t3_uses_no_sms_for_communication_and_overlaps_both_gemms(h100) -> None:
    spy = _SpyT3()
    spy.gathers = []
    run, pushed = _run(h100, spy)
    for c in run.period.chains:
        names = {k.name for seg, _, k in run.kernels if seg == c.name}
        assert names == {c.gemm1.name, c.rowop.name, c.gemm2.name}  # no collective kernels
    assert sum(e.bytes_moved for e in spy.dma) > 0
    for c, arrived in zip(run.period.chains, spy.gathers):
        g1, g2 = _kernels(run, c.name, c.gemm1.name), _kernels(run, c.name, c.gemm2.name)
        for g in range(h100.gpus):
            last = max(s.time for s in arrived[g])
            assert g2[g].started_at < last < g2[g].finished_at  # GEMM2 overlaps the AllGather
            forwards = [t for t, op in pushed[g] if op == "red" and g1[g].started_at <= t]
            assert forwards[0] < g1[g].finished_at  # the ring RS starts while GEMM1 runs


def test_t3_nvls_keeps_rs_ln_ag_gemm_coarse(h100) -> None:
    spy = _SpyT3Nvls()
    spy.rs_ends, spy.ag_ends = [], []
    run, pushed = _run(h100, spy)
    for c, rs_end, ag_end in zip(run.period.chains, spy.rs_ends, spy.ag_ends):
        g1, g2 = _kernels(run, c.name, c.gemm1.name), _kernels(run, c.name, c.gemm2.name)
        rows = _kernels(run, c.name, c.rowop.name)
        first_pull = min(t for ts in pushed for t, op in ts if op == "ld_reduce" and t >= g1[0].started_at)
        assert first_pull < min(k.finished_at for k in g1)  # the NVLS RS starts while GEMM1 runs
        for g in range(h100.gpus):
            assert rows[g].started_at >= rs_end[g].time
            assert g2[g].started_at >= ag_end[g].time > rows[g].finished_at
