"""Whole MoE layers under ``cais run``: every MoE preset under every EP kernel's scheme in
prefill, decode and train (small token counts), the expert block's breakdown, the
registry contract (a kernel added to EP_KERNELS runs without a change to the layer
path), and the refusals (docs/moe.md, "MoE layers")."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from cais.config import load_system
from cais.errors import UserError
from cais.experiments.layer import run_layer
from cais.experiments.spec import LayerSpec
from cais.kernels import ep_nccl
from cais.kernels.ep_registry import EP_KERNELS
from cais.schemes import get_scheme, moe_schemes, schemes
from cais.schemes.ep import EpScheme, scheme_for
from cais.workload.graph import Local, MoeStep
from cais.workload.moe import list_moe_models, load_moe_model
from cais.workload.moe_dataflow import build_moe_graph, build_moe_period

MODES = ("prefill", "decode", "train")


def small(name: str, seq: int = 32):
    """A MoE preset with a short prompt (16 token rows per GPU in decode: batch 16)."""
    return load_moe_model(name, seq=seq, batch=2)


def test_one_scheme_per_registered_kernel_and_none_among_the_dense() -> None:
    found = moe_schemes()
    assert sorted(cls.kernel for cls in found.values()) == sorted(EP_KERNELS)  # type: ignore[attr-defined]
    assert not set(found) & set(schemes())
    assert {"ep-nccl", "ep-allgather", "ep-deepep", "ep-deepep-ll"} <= set(found)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scheme", sorted(moe_schemes()))
@pytest.mark.parametrize("model", list_moe_models())
def test_every_moe_preset_runs_under_every_ep_scheme(model: str, scheme: str, mode: str) -> None:
    cfg = load_system("dgx-h100")
    mm = small(model)
    r = run_layer(cfg, mm, scheme, mode)
    period = build_moe_period(mm, cfg.gpus, mode)
    steps = [s for s in period.segments if isinstance(s, MoeStep)]
    assert steps and all(s.name in r.segments for s in steps if s.kind in ("exchange", "grouped_gemm"))
    mo = r.moe
    assert mo is not None and mo["kernel"] == get_scheme(scheme).kernel  # type: ignore[attr-defined]
    assert mo["dispatch_us"] > 0 and mo["combine_us"] > 0 and mo["grouped_gemm_us"] > 0
    # every (token, expert) row routed reaches an expert: nothing dropped, none invented
    assert sum(mo["received_rows"]) == cfg.gpus * mo["tokens_per_rank"] * mm.topk
    assert mo["dropped"] == 0
    assert r.total_us > mo["grouped_gemm_us"] > 0
    exchanges = [s.name for s in steps if s.kind == "exchange"]
    assert exchanges == (["dispatch", "combine", "combine_bwd", "dispatch_bwd"] if mode == "train"
                         else ["dispatch", "combine"])
    assert (mo["shared_us"] > 0) == (mm.shared_experts > 0)


def test_backward_swaps_dispatch_and_combine() -> None:
    period = build_moe_period(small("mixtral-8x7b"), 8, "train")
    ops = {s.name: s.kernel for s in period.segments if isinstance(s, MoeStep) and s.kind == "exchange"}
    assert ops == {"dispatch": "dispatch", "combine": "combine", "combine_bwd": "dispatch", "dispatch_bwd": "combine"}
    wgrads = [s.name for s in period.segments if isinstance(s, MoeStep) and s.role == "wgrad"]
    assert wgrads == ["expert_fc2_wgrad", "expert_fc1_wgrad"]


@pytest.mark.parametrize("attention", ["tp", "dp"])
def test_attention_tp_or_data_parallel(attention: str) -> None:
    mm = small("qwen3-30b-a3b", seq=64)
    g = build_moe_graph(mm, 8, "train", attention)
    assert not g.problems()
    kinds = {o.kind for o in g.ops}
    assert ("reduce" in kinds and "gather" in kinds) == (attention == "tp")
    r = run_layer(load_system("dgx-h100"), mm, "ep-nccl", "prefill", attention=attention)
    assert r.moe is not None
    # TP with sequence parallelism: each GPU routes its shard; data parallel: its own batch
    assert r.moe["tokens_per_rank"] == (64 * 2 // 8 if attention == "tp" else 64 * 2)
    assert ("L1" in r.sublayers) == (attention == "tp")


def test_the_dense_path_runs_the_attention_part() -> None:
    """The MoE period's attention, out-proj, norms and QKV are the dense graph's ops."""
    g = build_moe_graph(small("mixtral-8x7b"), 8, "prefill", "tp")
    by = {o.name: o for o in g.ops}
    assert by["attention"].kernel == "attention" and by["dropout_add_ln2"].kernel == "residual_norm"
    assert by["L1.reduce"].kernel == "reducescatter" and by["gather_n1"].kernel == "allgather"
    period = build_moe_period(small("mixtral-8x7b"), 8, "prefill")
    assert period.chains and period.chains[0].gemm2.name == "router"  # the dense sub-layer machinery, L1


def test_shared_experts_overlap_where_the_stack_overlaps_them() -> None:
    cfg, mm = load_system("dgx-h100"), small("deepseek-v3", seq=64)
    side = [s for s in build_moe_period(mm, 8, "prefill").segments if getattr(s, "side", False)]
    assert [s.name for s in side] == ["shared_fc1", "shared_act", "shared_fc2"]
    over = run_layer(cfg, mm, "ep-nccl", "prefill")  # Megatron overlaps them with the all-to-all
    serial = run_layer(cfg, mm, "ep-allgather", "prefill")  # not with the all-gather dispatcher
    assert over.moe is not None and serial.moe is not None
    assert over.moe["shared_overlap_us"] > 0
    assert serial.moe["shared_overlap_us"] == 0


def test_a_kernel_added_to_the_registry_plugs_in_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry contract: ``kernels(m, call)`` (and the optional PERMUTE,
    SHARED_OVERLAP) is all the layer path asks of an EP kernel."""
    calls: list[str] = []
    fake = ModuleType("fake_ep")

    def kernels(m, call):  # type: ignore[no-untyped-def]
        calls.append(call.op)
        return ep_nccl.kernels(m, call)
    fake.kernels = kernels  # type: ignore[attr-defined]
    fake.PERMUTE = "none"  # type: ignore[attr-defined]
    monkeypatch.setitem(EP_KERNELS, "fake", fake)
    cls = scheme_for("fake")
    assert cls.name == "ep-fake" and issubclass(cls, EpScheme)
    import importlib

    import cais.schemes.ep as ep_schemes
    importlib.reload(ep_schemes)  # as the package would import with the entry in the registry's source
    try:
        assert "ep-fake" in moe_schemes()
        r = run_layer(load_system("dgx-h100"), small("mixtral-8x7b"), "ep-fake", "train")
    finally:
        monkeypatch.undo()
        vars(ep_schemes).pop("EpFake", None)  # a reload keeps the module's old names
        importlib.reload(ep_schemes)
    assert "ep-fake" not in moe_schemes()
    assert calls == ["dispatch", "combine", "dispatch", "combine"]
    assert r.moe is not None and r.moe["kernel"] == "fake"
    assert "permute" not in r.segments  # PERMUTE none: no permute kernel ran


def test_masked_layout_for_the_low_latency_kernel() -> None:
    cfg, mm = load_system("dgx-h100"), small("mixtral-8x7b")
    ll = run_layer(cfg, mm, "ep-deepep-ll", "decode")
    normal = run_layer(cfg, mm, "ep-deepep", "decode")
    assert "permute" not in ll.segments and "permute" in normal.segments


@pytest.mark.parametrize("kwargs,field", [
    ({"scheme": "tp-nvls"}, "scheme"), ({"attention": "both"}, "attention"), ({"sim": "mirror"}, "sim"),
    ({"functional": True}, "functional")])  # functional: mixtral's experts are too big for numpy
def test_bad_input_is_one_line_naming_the_field(kwargs: dict, field: str) -> None:
    args = {"scheme": "ep-nccl", "mode": "prefill", **kwargs}
    with pytest.raises(UserError) as err:
        run_layer(load_system("dgx-h100"), small("mixtral-8x7b"), args.pop("scheme"), args.pop("mode"), **args)
    assert str(err.value).startswith(f"{field}:") and "\n" not in str(err.value)


def test_an_ep_scheme_refuses_a_dense_model() -> None:
    with pytest.raises(UserError, match="^scheme: 'ep-deepep' runs mixture-of-experts layers"):
        LayerSpec("llama3-8b", "ep-deepep", "prefill", seq=64).run()


def test_ep_degree_must_divide_the_experts() -> None:
    with pytest.raises(UserError, match="^gpus: 3 EP ranks do not divide"):
        build_moe_graph(small("mixtral-8x7b"), 3, "prefill", "dp")


def test_cli_run_json_reports_the_expert_block(capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import main

    main(["run", "--model", "qwen3-30b-a3b", "--scheme", "ep-deepep", "--mode", "prefill", "--seq", "64",
          "--json"])
    out = json.loads(capsys.readouterr().out)
    mo = out["moe"]
    for key in ("dispatch_us", "combine_us", "grouped_gemm_us", "imbalance_rank", "imbalance_expert",
                "send_matrix_rank", "send_matrix_expert"):
        assert key in mo
    assert len(mo["send_matrix_rank"]) == 8 and mo["imbalance_expert"] >= 1.0
    assert out["total_us"] > mo["dispatch_us"] + mo["combine_us"] + mo["grouped_gemm_us"]


def test_cli_run_table_and_attention_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import main

    main(["run", "--model", "mixtral-8x7b", "--scheme", "ep-nccl", "--mode", "decode", "--batch", "8",
          "--attention", "dp"])
    out = capsys.readouterr().out
    assert "experts: EP 8 with the 'nccl' kernel, attention dp" in " ".join(out.split())
    assert main(["run", "--model", "llama3-8b", "--scheme", "tp-nvls", "--mode", "prefill", "--attention", "dp"]) == 2
    assert capsys.readouterr().err.startswith("cais: error: --attention:")


def test_deterministic() -> None:
    cfg, mm = load_system("dgx-h100"), small("deepseek-v3")
    a, b = run_layer(cfg, mm, "ep-deepep", "train"), run_layer(cfg, mm, "ep-deepep", "train")
    assert a.total_us == b.total_us and a.events == b.events and a.moe == b.moe


def test_dense_periods_have_no_moe_segments() -> None:
    from cais.workload.graph import build_period
    from cais.workload.models import load_model

    p = build_period(load_model("llama3-8b"), 8, "train", True)
    assert not any(isinstance(s, MoeStep) or (isinstance(s, Local) and s.rowop is not None) for s in p.segments)
    assert p.routing is None


TINY = {"name": "tiny-moe", "family": "test", "hidden": 128, "heads": 8, "kv_heads": 8, "head_dim": 16, "layers": 2,
        "dense_ffn_hidden": 256, "experts": 16, "topk": 4, "expert_ffn_hidden": 64, "shared_experts": 1,
        "n_group": 4, "topk_group": 2, "seq": 24, "batch": 2}


@pytest.mark.parametrize("attention", ["tp", "dp"])
@pytest.mark.parametrize("scheme", sorted(moe_schemes()))
def test_functional_expert_block_of_the_layer_is_exact(scheme: str, attention: str, tmp_path) -> None:
    """The layer period's routing and rows through the scheme's EP kernel, SwiGLU experts
    on the Q10 grid: every GPU's output equals the unsharded block bit for bit."""
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    spec = LayerSpec(str(path), scheme, "prefill", attention=attention)
    r = spec.run(functional=True, seed=3)
    assert r.checked == 1 and r.mismatches == []
    assert r.moe is not None and r.moe["tokens_per_rank"] == (6 if attention == "tp" else 48)


def test_functional_check_can_fail() -> None:
    """A wrong expert on the receiving side is caught (the check compares real values)."""
    import numpy as np

    from cais.experiments import ep
    from cais.workload.moe import MoeSpec

    mm = MoeSpec.model_validate(TINY)
    rt = build_moe_period(mm, 8, "prefill", "dp").routing
    assert rt is not None
    cfg = load_system("dgx-h100")
    assert ep.expert_block_check(cfg, "deepep", mm, rt)
    real = ep.functional_check
    calls = []

    def off_by_one(cfg_, kernel, call, seed=0, x=None, expert=None):  # type: ignore[no-untyped-def]
        def wrong(e: int, row: np.ndarray) -> np.ndarray:
            calls.append(e)
            return expert(e, row) + (1.0 if len(calls) == 5 else 0.0)  # one row of one expert wrong
        return real(cfg_, kernel, call, seed, x, wrong)
    ep.functional_check = off_by_one  # type: ignore[assignment]
    try:
        assert not ep.expert_block_check(cfg, "deepep", mm, rt)
    finally:
        ep.functional_check = real
    assert len(calls) > 5
