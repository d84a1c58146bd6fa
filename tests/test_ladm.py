"""LADM: one NUMA GPU, no collectives; partial sums reach their owner by remote
``red``, consumers ``ld`` the rows they need once per tile."""

import pytest

import cais.experiments.layer as layer
from cais.experiments.layer import run_layer
from cais.hw.compute import ComputeModel
from cais.config import apply_overrides, load_system
from cais.machine import Machine
from cais.schemes.base import LayerRun
from cais.kernels.remote_gemm import RemoteAccess, remote_operands, tile_order
from cais.schemes.ladm import Ladm
from cais.workload.graph import build_period
from cais.workload.models import ModelSpec

GPT = ModelSpec(name="tiny-gpt", family="gpt", hidden=256, ffn_hidden=512, heads=4, layers=2, gated_mlp=False,
                norm="layernorm", activation="gelu", seq=64, batch=4)


@pytest.fixture(scope="module")
def four_gpus():
    """Four GPUs whose LADM tiles load their rows themselves, as LADM's mainloop does
    (the H100 presets stage each remote block once: tests/test_remote_reuse.py)."""
    return apply_overrides(load_system("dgx-h100").with_overrides(gpus=4), {"remote_read.strategy": "reload"})


class _FineLoads(Ladm):
    """Small lds: several K-steps per tile and several loads in flight."""

    name = ""

    def access(self, r):
        return RemoteAccess(r.m, load_bytes=8 * 1024)


class _NoDrain(Ladm):
    """The row-wise op starts after the GPU's own GEMM1 kernel, not after every GPU's
    reductions have landed."""

    name = ""

    def chain(self, r, c, deps):
        n, over = r.m.n, r.cm.kernel_overhead_ps
        g1 = [r.submit(g, r.reduce_gemm(g, c.gemm1, c.reduced, self._access)[0], [deps[g]], over, c.name)
              for g in range(n)]
        rows = [r.submit(g, r.rowop_kernel(g, c.rowop), [g1[g]], 0, c.name) for g in range(n)]
        after = r.barrier(rows)
        ops = remote_operands(c.gemm2, self._sharded)
        return [r.submit(g, r.load_gemm(g, c.gemm2, ops, self._access), [after[g]], over, c.name) for g in range(n)]


class _NoBarrier(Ladm):
    """No global barriers: each GPU's row-wise op starts once the reductions *it*
    issued are fenced, and its GEMM2 once its own row-wise op is done. GPU 0 starts
    50 us late, so that its peers' row-wise ops run before its reductions arrive."""

    name = ""

    def chain(self, r, c, deps):
        n, over = r.m.n, r.cm.kernel_overhead_ps
        flushed = []
        for g in range(n):
            k, drain = r.reduce_gemm(g, c.gemm1, c.reduced, self._access)
            flushed.append(drain.done)
            r.submit(g, k, [deps[g]], over + (50_000_000 if g == 0 else 0), c.name)
        rows = [r.submit(g, r.rowop_kernel(g, c.rowop), [flushed[g]], 0, c.name) for g in range(n)]
        ops = remote_operands(c.gemm2, self._sharded)
        return [r.submit(g, r.load_gemm(g, c.gemm2, ops, self._access), [rows[g]], over, c.name) for g in range(n)]


def _run(monkeypatch, cfg, scheme: Ladm, mode: str):
    monkeypatch.setattr(layer, "get_scheme", lambda name: scheme)
    return run_layer(cfg, GPT, "ladm", mode, functional=True, seed=3)


@pytest.mark.parametrize("mode", ["prefill", "train"])
def test_fine_loads_assemble_the_operands_exactly(four_gpus, monkeypatch, mode) -> None:
    r = _run(monkeypatch, four_gpus, _FineLoads(), mode)
    assert r.checked > 0 and r.mismatches == []


@pytest.mark.parametrize("variant", [_NoDrain, _NoBarrier])
def test_a_missing_global_dependency_is_caught(four_gpus, monkeypatch, variant) -> None:
    r = _run(monkeypatch, four_gpus, variant(), "prefill")
    assert r.mismatches


def test_tile_order_follows_the_cutlass_heuristic() -> None:
    from cais.kernels.gemm import GemmShape

    tall, wide = GemmShape(1024, 256, 64, 128, 128), GemmShape(256, 1024, 64, 128, 128)
    assert tile_order(tall)[:2] == [(0, 0), (0, 1)]  # along N
    assert tile_order(wide)[:2] == [(0, 0), (1, 0)]  # along M
