"""The example scheme ``ladm-colmajor``: LADM's kernels with a column-major tile
order, a strategy choice in one short module."""

from cais.experiments.layer import run_layer
from cais.config import apply_overrides, load_system
from cais.kernels.gemm import GemmShape
from cais.kernels.remote_gemm import RemoteAccess
from cais.machine import Machine
from cais.schemes.ladm_colmajor import ColumnMajorAccess
from cais.workload.models import ModelSpec

GPT = ModelSpec(name="tiny-gpt", family="gpt", hidden=256, ffn_hidden=512, heads=4, layers=2, gated_mlp=False,
                norm="layernorm", activation="gelu", seq=64, batch=4)


def test_colmajor_reproduces_the_unsharded_layer_in_another_order_and_time() -> None:
    cfg = load_system("dgx-h100").with_overrides(gpus=4)
    col = run_layer(cfg, GPT, "ladm-colmajor", "prefill", functional=True, seed=3)
    row = run_layer(cfg, GPT, "ladm", "prefill", functional=True, seed=3)
    assert col.checked > 0 and col.mismatches == []
    # the order moves the time where the switch inputs queue per traffic class (on the presets' queue per
    # destination the two tie on this small layer: no queue holds another destination's rows)
    by_class = apply_overrides(cfg, {"link.vc_policy": "class", "link.vcs": "8"})
    assert run_layer(by_class, GPT, "ladm-colmajor", "prefill").total_us != run_layer(by_class, GPT, "ladm",
                                                                                       "prefill").total_us
    m = Machine(cfg)
    tall = GemmShape(1024, 256, 64, 128, 128)  # more row tiles: CUTLASS rasters along N
    assert RemoteAccess(m).tile_order(tall, True)[:2] == [(0, 0), (0, 1)]
    assert ColumnMajorAccess(m).tile_order(tall, True)[:2] == [(0, 0), (1, 0)]
