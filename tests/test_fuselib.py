"""FuseLib and FuseLib-NVLS: tiles split at shard boundaries, row blocks wait for
every GPU's contribution, and the fused kernel beats the bulk-synchronous chain."""

import pytest

from cais.engine import Countdown
from cais.experiments.layer import run_layer
from cais.config import load_system
from cais.kernels.fused_workers import Piece, PushPath, owner_pieces
from cais.kernels.local import row_blocks
from cais.schemes.fuselib import FuseLib
from cais.workload.models import ModelSpec

GPT = ModelSpec(name="tiny-gpt", family="gpt", hidden=256, ffn_hidden=512, heads=4, layers=2, gated_mlp=False,
                norm="layernorm", activation="gelu", seq=64, batch=4)


@pytest.fixture(scope="module")
def four_gpus():
    return load_system("dgx-h100").with_overrides(gpus=4)


def test_a_tile_spanning_shards_is_split_per_owner() -> None:
    blocks = row_blocks(64, 32)  # a 64-row shard in two 32-row blocks
    assert owner_pieces(96, 128, 64, blocks) == [Piece(1, 32, 0, 32, (1,)), Piece(2, 0, 32, 64, (0, 1)),
                                                 Piece(3, 0, 96, 32, (0,))]


class _EarlyCount(Countdown):
    """Fires after a fraction of the arrivals and ignores the rest."""

    def arrive(self, sim, n=1):
        if self.remaining > 0:
            super().arrive(sim, min(n, self.remaining))


class _EarlyPush(PushPath):
    """FuseLib's data path whose owners start a row block after half of the GPUs'
    flags for it."""

    def block_flags(self, n):
        return _EarlyCount(n // 2)


class _Early(FuseLib):
    """FuseLib on that broken data path."""

    name = ""

    def path(self):
        return _EarlyPush()


def test_a_row_block_started_early_is_caught(four_gpus, monkeypatch) -> None:
    import cais.experiments.layer as layer

    monkeypatch.setattr(layer, "get_scheme", lambda name: _Early())
    r = run_layer(four_gpus, GPT, "fuselib", "prefill", functional=True, seed=1)
    assert any("x2" in m or "n2" in m for m in r.mismatches), r.mismatches


@pytest.mark.parametrize("scheme", ["fuselib", "fuselib-nvls"])
def test_the_fused_chain_beats_bulk_synchronous_sp(four_gpus, scheme) -> None:
    fused = run_layer(four_gpus, GPT, scheme, "train")
    bulk = run_layer(four_gpus, GPT, "sp-nvls", "train")
    for name in ("L1", "L2", "L3", "L4"):
        assert fused.sublayers[name]["time_us"] < bulk.sublayers[name]["time_us"]
