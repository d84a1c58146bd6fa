"""Remote-access strategies (``remote_read.strategy``): how the TBs of one GEMM share
the remote rows they read. Each keeps every scheme exact in functional mode, and an
LADM layer's wire bytes equal the closed form: a remote block crosses to each GPU
once per column tile (reload), once per cluster of column tiles (TMA multicast) or
once (staged, and an L2 that keeps peer reads)."""

from __future__ import annotations

import pytest

from cais.experiments.layer import run_layer
from cais.hw.compute import ComputeModel
from cais.config import apply_overrides, load_system
from cais.kernels.gemm import GemmShape
from cais.kernels.remote_reuse import RemoteReuse
from cais.machine import Machine
from cais.schemes.base import LayerRun
from cais.schemes.ladm import Ladm
from cais.workload.graph import build_period

from test_ladm import GPT


def _four(**sets: str):
    return apply_overrides(load_system("dgx-h100"), {"gpus": "4", **sets})


STRATEGIES = {
    "reload": {"remote_read.strategy": "reload"},
    "cluster2": {"remote_read.strategy": "cluster", "remote_read.cluster_ctas": "2"},
    "cluster3": {"remote_read.strategy": "cluster", "remote_read.cluster_ctas": "3"},
    "staged": {"remote_read.strategy": "staged"},
    "copy-engine": {"remote_read.strategy": "copy-engine"},
    "comm-sms": {"remote_read.strategy": "comm-sms"},
    "copy-engine-chunks": {"remote_read.strategy": "copy-engine", "remote_read.copy_chunk_kB": "2"},
    "comm-sms-chunks": {"remote_read.strategy": "comm-sms", "remote_read.copy_chunk_kB": "2"},
}
COPIES = ["copy-engine", "comm-sms", "copy-engine-chunks", "comm-sms-chunks"]


def test_clusters_launch_together_along_the_shared_operands_other_dimension() -> None:
    shape = GemmShape(512, 640, 64, 128, 128)  # 4 row tiles x 5 column tiles
    reuse = RemoteReuse("cluster", 2, along_n=True)
    col_raster = [(i, j) for j in range(5) for i in range(4)]
    order = reuse.launch_order(col_raster, shape)
    assert sorted(order) == sorted(col_raster)  # a permutation
    assert order[:4] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert reuse.members((3, 4), shape) == [(3, 4)]  # the last cluster of a row is short
    assert reuse.scope((2, 2), shape) == reuse.scope((2, 3), shape) != reuse.scope((3, 2), shape)
    lead = reuse.leaders(order, shape)
    assert lead is not None and lead[(1, 1)] == lead[(1, 0)] == order.index((1, 0))
    by_rows = RemoteReuse("cluster", 2, along_n=False)  # B shared: clusters of row tiles
    assert by_rows.members((1, 3), shape) == [(0, 3), (1, 3)]
    assert RemoteReuse("reload").launch_order(col_raster, shape) is col_raster


def test_the_strategy_comes_from_the_system_and_the_l2_overrides_it() -> None:
    assert RemoteReuse.of(_four(), ["a"]).strategy == "auto"  # the H100 presets' default: the as-sold rule
    assert RemoteReuse.of(_four(), ["a"]).copies  # ... copies, as real code does
    assert RemoteReuse.of(_four(**STRATEGIES["reload"]), ["a"]).strategy == "reload"
    assert RemoteReuse.of(_four(**STRATEGIES["cluster3"]), ["b"]) == RemoteReuse("cluster", 3, along_n=False)
    keep = _four(**{"gpu.l2_keeps_peer_reads": "true", **STRATEGIES["staged"]})
    assert RemoteReuse.of(keep, ["a"]).strategy == "l2"
    # staging reads every row locally and writes the remote share once; otherwise only own rows
    assert RemoteReuse("staged").local_shares(["a"], 4) == {"a": 1.75}
    assert RemoteReuse("cluster", 2).local_shares(["a", "b"], 4) == {"a": 0.25, "b": 0.25}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_ladm_wire_bytes_match_the_closed_form(name: str) -> None:
    """No collective; every GPU sends the partial rows it does not own once, and loads
    the activation rows it does not own once per column tile of each consumer (reload,
    LADM's own mainloop), once per cluster, or once."""
    cfg = _four(**STRATEGIES[name])
    period = build_period(GPT, cfg.gpus, "prefill", True)
    m = Machine(cfg)
    run = LayerRun(m, GPT, period, ComputeModel.load(cfg.gpu.compute_model))
    Ladm().run(run)
    m.run()
    d, eb, n = period.dims, GPT.dtype_bytes, cfg.gpus
    remote_rows = d.tokens - d.rows_l
    want, reloads = 0, 0
    for c in period.chains:
        want += remote_rows * d.hidden * eb  # reductions
        tiles_n = run.shape(c.gemm2).tiles_n
        reloads += tiles_n
        per = {"reload": tiles_n, "staged": 1}.get(name) or (1 if name in COPIES else -(-tiles_n // int(name[-1])))
        want += remote_rows * d.hidden * eb * per  # loads: responses carry the data
    assert reloads > len(period.chains)  # the GEMMs have several column tiles: the strategies differ
    assert m.fabric.injected == n * want


@pytest.mark.parametrize("name", ["cluster3", "staged", "copy-engine", "comm-sms", "comm-sms-chunks"])
@pytest.mark.parametrize("scheme", ["ladm", "cais-base", "cais", "cais-sw"])
def test_every_strategy_is_exact(scheme: str, name: str) -> None:
    r = run_layer(_four(**STRATEGIES[name]), GPT, scheme, "train", functional=True, seed=5)
    assert r.checked >= 30 and r.mismatches == []


def test_sharing_cuts_a_cais_layers_delivered_bytes_in_order() -> None:
    down = {}
    for name in ("reload", "cluster2", "staged"):
        r = run_layer(_four(**STRATEGIES[name]), GPT, "cais", "prefill")
        down[name] = sum(r.as_json()["wire_bytes"][str(g)]["down"] for g in range(4))
    # the tiny GEMMs have two column tiles: a cluster of two already delivers each block once
    assert down["staged"] == down["cluster2"] < down["reload"]


def test_copy_chunks_cover_every_owner_once_in_the_copy_order() -> None:
    from cais.kernels.remote_copy import chunks
    from cais.kernels.remote_gemm import Operand, Sharded

    op = Operand("a", Sharded("n1", 64, 256), False)  # 64 rows x 256 cols per owner
    whole = chunks([op], ["g1"], 4, 2, 0, first=2)
    assert [(c.owner, c.r0, c.nr) for c in whole] == [(2, 0, 64), (3, 0, 64), (0, 0, 64), (1, 0, 64)]
    assert whole[0].src.nbytes == whole[0].dst.nbytes == 64 * 256 * 2
    assert whole[1].dst.start == 3 * 64 * 256  # the owner's rows in the gathered tensor
    cut = chunks([op], ["g1"], 4, 2, 16 * 1024)  # 32 rows a chunk
    assert [(c.owner, c.r0, c.nr) for c in cut[:5]] == [(0, 0, 32), (1, 0, 32), (2, 0, 32), (3, 0, 32), (0, 32, 32)]
    assert sum(c.nr for c in cut) == 4 * 64


@pytest.mark.parametrize("scheme", ["ladm", "cais-sw"])
def test_copies_put_a_training_periods_bytes_on_the_wire_as_staging(scheme: str) -> None:
    """Training (the weight gradients' loads too): a copy stage delivers each remote
    block to each GPU once per GEMM that loads it, as staging does; plain loads (no
    merging), so the wire bytes are equal."""
    wire = {}
    for name in ("staged", "copy-engine", "comm-sms", "comm-sms-chunks"):
        wire[name] = run_layer(_four(**STRATEGIES[name]), GPT, scheme, "train").as_json()["wire_bytes"]
    assert wire["copy-engine"] == wire["comm-sms"] == wire["comm-sms-chunks"]
    down = {k: sum(v[str(g)]["down"] for g in range(4)) for k, v in wire.items()}
    assert down["copy-engine"] == down["staged"]


def test_comm_sms_keep_cais_merging_and_the_copy_engine_cannot() -> None:
    """comm-sms copy TBs issue ld.cais under CAIS (the switch merges the GPUs' reads of
    one block: less up-link traffic from the owners), the copy engine plain reads."""
    up = {}
    for name in ("copy-engine", "comm-sms"):
        r = run_layer(_four(**STRATEGIES[name]), GPT, "cais-base", "prefill").as_json()["wire_bytes"]
        up[name] = sum(r[str(g)]["up"] for g in range(4))
    assert up["comm-sms"] < up["copy-engine"]
