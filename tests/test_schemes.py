"""Every scheme, in functional mode, leaves every GPU with exactly the tensors of the
unsharded numpy layer (forward outputs and gradients); a broken dependency is caught."""

import pytest

from cais.experiments.layer import run_layer
from cais.config import load_system
from cais.schemes import get_scheme, schemes
from cais.schemes.sp_nvls import SpNvls
from cais.workload.models import ModelSpec

GPT = ModelSpec(name="tiny-gpt", family="gpt", hidden=256, ffn_hidden=512, heads=4, layers=2, gated_mlp=False,
                norm="layernorm", activation="gelu", seq=64, batch=4)
LLAMA = ModelSpec(name="tiny-llama", family="llama", hidden=256, ffn_hidden=384, heads=8, kv_heads=4, layers=2,
                  gated_mlp=True, norm="rmsnorm", activation="swiglu", seq=32, batch=4)


@pytest.fixture(scope="module")
def four_gpus():
    return load_system("dgx-h100").with_overrides(gpus=4)


@pytest.mark.parametrize("mode", ["prefill", "decode", "train"])
@pytest.mark.parametrize("scheme", list(schemes()))
def test_scheme_reproduces_the_unsharded_layer(four_gpus, scheme, mode) -> None:
    model = GPT.with_run(batch=8) if mode == "decode" else GPT  # decode: one token row per sequence
    r = run_layer(four_gpus, model, scheme, mode, functional=True, seed=1)
    assert r.checked >= (60 if mode == "train" else 25)
    assert r.mismatches == []
    assert r.total_us > 0 and set(r.sublayers) == ({"L1", "L2", "L3", "L4"} if mode == "train" else {"L1", "L2"})


@pytest.mark.parametrize("scheme", list(schemes()))
def test_scheme_with_gqa_swiglu_rmsnorm(four_gpus, scheme) -> None:
    r = run_layer(four_gpus, LLAMA, scheme, "train", functional=True, seed=2)
    assert r.mismatches == []


class _NoGatherWait(SpNvls):
    """SP-NVLS with the next GEMM launched right after the row-wise kernel: it no
    longer waits for the AllGather."""

    name = ""

    def chain(self, r, c, deps):
        n, over = r.m.n, r.cm.kernel_overhead_ps
        g1 = [r.submit(g, r.gemm_kernel(g, c.gemm1), [deps[g]], over, c.name) for g in range(n)]
        red = self.collective_step(r, "reducescatter", c.gemm1.ops.c, c.reduced, g1, c.name)
        rows = [r.submit(g, r.rowop_kernel(g, c.rowop), [red[g]], 0, c.name) for g in range(n)]
        self.collective_step(r, "allgather", c.gather_src, c.gather_dst, rows, c.name)
        return [r.submit(g, r.gemm_kernel(g, c.gemm2), [rows[g]], 0, c.name) for g in range(n)]


def test_a_broken_dependency_is_caught(four_gpus, monkeypatch) -> None:
    import cais.experiments.layer as layer

    monkeypatch.setattr(layer, "get_scheme", lambda name: _NoGatherWait())
    r = run_layer(four_gpus, GPT, "sp-nvls", "prefill", functional=True, seed=1)
    assert any("n2" not in m and ("g" in m or "qkv_next" in m) for m in r.mismatches), r.mismatches


def test_unknown_scheme_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="valid: tp-nvls, sp-nvls"):
        get_scheme("nccl")
