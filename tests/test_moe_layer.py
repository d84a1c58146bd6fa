"""Whole MoE layers under ``cais run``: every MoE preset under every EP kernel's scheme in
prefill, decode and train (small token counts), the expert block's breakdown, the
registry contract (a kernel added to EP_KERNELS runs without a change to the layer
path), and the refusals (docs/moe.md, "MoE layers")."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from cais.config import load_system
from cais.errors import UserError
from cais.experiments.layer import run_layer
from cais.experiments.spec import LayerSpec
from cais.kernels import ep_nccl
from cais.kernels.ep_registry import EP_KERNELS
from cais.schemes.ep import fused_name
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
    mo = r.moe
    assert mo is not None and mo["kernel"] == get_scheme(scheme).kernel  # type: ignore[attr-defined]
    if get_scheme(scheme).fuses:  # type: ignore[attr-defined]  # dispatch, experts and combine in one kernel
        assert fused_name("dispatch", "combine") in r.segments and mo["fused_us"] > 0
        assert mo["dispatch_us"] == mo["combine_us"] == 0
        assert (mo["grouped_gemm_us"] > 0) == (mode == "train")  # the weight gradients run apart
        return
    assert steps and all(s.name in r.segments for s in steps if s.kind in ("exchange", "grouped_gemm"))
    assert mo["dispatch_us"] > 0 and mo["combine_us"] > 0 and mo["grouped_gemm_us"] > 0 and mo["fused_us"] == 0
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


def test_gh200_nvl32_is_dyshaps_setting_as_sourced() -> None:
    """32 GPUs; 18 NVLink4 links each at 25 GB/s per direction (900 GB/s bidirectional);
    9 NVSwitch chips, 2 links per GPU each, so every chip's 64 ports are used; the GH200's
    Hopper GPU with 144 GB of HBM3e at 4.9 TB/s."""
    cfg = load_system("gh200-nvl32")
    assert cfg.gpus == 32 and cfg.switch.chips == 9 and list(cfg.switch.links_per_gpu) == [2] * 9
    assert cfg.links_per_gpu == 18 and cfg.link.bandwidth_GBps == 25.0
    assert 2 * cfg.links_per_gpu * cfg.link.bandwidth_GBps == 900.0
    assert cfg.gpus * cfg.switch.links_per_gpu[0] == 64  # one NVSwitch3 chip's NVLink4 ports
    assert (cfg.gpu.sms, cfg.gpu.hbm_capacity_GB, cfg.gpu.hbm_bandwidth_GBps) == (132, 144.0, 4900.0)
    r = run_layer(cfg, small("deepseek-v3"), "ep-deepep-ll", "decode")  # EP 32: 8 of 256 experts per GPU
    assert r.moe is not None and r.moe["ep"] == 32 and len(r.moe["received_rows"]) == 32


def _moe_doc():  # type: ignore[no-untyped-def]
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("moe_doc", root / "scripts" / "moe_doc.py")
    assert spec and spec.loader
    doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc)
    return root, doc


def test_the_moe_page_is_its_runs() -> None:
    """docs/moe.md's "which EP kernel wins where" block is the shipped full grid's
    section (moe.md), its winners those of moe.csv, its in-switch ladder that of
    moe_switch.csv (every world, mode, model and routing), its claims those of claims.json."""
    import pandas as pd

    from cais.reproduce.experiments.moe import KERNELS, winners

    root, doc = _moe_doc()
    out = root / "docs" / "reproduce-results" / "moe"
    page = (root / "docs" / "moe.md").read_text()
    head, rest = page.split(doc.BEGIN, 1)
    block, tail = rest.split(doc.END, 1)
    shipped = (out / "moe.md").read_text().strip()
    assert block.strip() == doc.from_docs(shipped) and "ANALYSIS FAILED" not in block
    t = pd.read_csv(out / "moe.csv")
    assert len(t) >= 50 and set(t["system"]) >= {"dgx-h100", "hgx-h800", "nvl72", "gh200-nvl32"}
    assert t["ep"].max() == 72 and t["tokens"].max() == 8192
    times = t[[f"{k} (us)" for k in KERNELS]]
    assert (times.idxmin(axis=1).str[:-5] == t["winner"]).all()  # the winner is the fastest kernel
    for system, n in t["system"].value_counts().items():
        assert f"On {system} (" in block and f"of {n} points" in block
    ladder = pd.read_csv(out / "moe_switch.csv")  # the in-switch ladder in layers (moe_switch.py)
    assert set(ladder["system"]) == {"dgx-h100", "gh200-nvl32", "nvl72"} and set(ladder["mode"]) == set(MODES)
    assert set(ladder["model"]) == {"deepseek-v3", "qwen3-30b-a3b"}
    assert set(ladder["routing"]) == {"uniform", "powerlaw"}
    assert ladder.groupby("system")["model"].nunique().to_dict() == {"dgx-h100": 2, "gh200-nvl32": 2, "nvl72": 1}
    assert ladder.groupby("system")["ep"].first().to_dict() == {"dgx-h100": 8, "gh200-nvl32": 32, "nvl72": 64}
    # what the page's prose ("What the runs say") reads from it: power-law routing shrinks the multicast's gain at
    # every case off one node and moves it by -0.7 to +1.2 points on dgx-h100 (up at 9 of 12); where DeepEP
    # low-latency is the best software off one node, ep-switch's layer outside its expert block is longer than
    # the low-latency one's
    wide = ladder.pivot_table(index=["system", "model", "mode", "tokens"], columns="routing",
                              values="multicast (block)")
    off = wide.drop(index="dgx-h100", level="system")
    node = wide.xs("dgx-h100", level="system")
    assert len(off) and (off["powerlaw"] < off["uniform"]).all()
    moved = node["powerlaw"] - node["uniform"]
    assert len(node) == 12 and (moved > 0).sum() == 9 and -0.0075 <= moved.min() and moved.max() <= 0.0125
    ll = ladder[(ladder["system"] != "dgx-h100") & (ladder["best software"] == "ep-deepep-ll")]
    assert len(ll) and ((ll["ep-switch (us)"] - ll["ep-switch block (us)"])
                        > (ll["ep-deepep-ll (us)"] - ll["ep-deepep-ll block (us)"])).all()
    claims = json.loads((out / "claims.json").read_text())
    per_mode = ladder.groupby(["system", "mode"]).ngroups
    assert claims["grid"] == "full" and len(claims["claims"]["moe"]) == 3 + per_mode + ladder["system"].nunique() + 3
    for c in claims["claims"]["moe"]:
        assert f"{c['name']}: {'holds' if c['holds'] else 'does not hold'}: {c['figure']}." in " ".join(block.split())
    for system in ladder["system"].unique():
        assert f"On {system} (EP " in block and f"reproduce-results/moe/moe_switch_{system}.png" in block
    for png in ("moe_dgx-h100.png", "moe_nvl72.png", "moe_gh200-nvl32.png"):
        assert (out / png).is_file() and f"reproduce-results/moe/{png}" in block
    assert not __import__("re").search(r"\d+(\.\d+)?\s*us\b", head[head.rfind("## Which EP kernel"):])


def test_winners_table_from_rows() -> None:
    """The analysis picks the fastest kernel per point and the runner-up's margin."""
    import pandas as pd

    from cais.reproduce.experiments.moe import winners

    rows = pd.DataFrame([{"system": "s", "gpus": 8, "tokens": 1, "kernel": k, "time_us": v}
                         for k, v in (("nccl", 30.0), ("allgather", 20.0), ("deepep", 10.0), ("deepep-ll", 40.0))])
    t = winners(rows)
    assert t.loc[0, "winner"] == "deepep" and t.loc[0, "margin"] == 2.0


def test_nccl_p2p_protocol_by_size_as_nccl_picks_it() -> None:
    """addP2pToPlan: LL up to 16 KiB per channel of the send, else Simple."""
    from cais.kernels.ep_nccl import P2P_LL_THRESHOLD, p2p_channels, p2p_protocol

    step = 512 * 1024
    assert p2p_channels(16384, 8, 16, step) == 1 and p2p_channels(1 << 20, 8, 16, step) == 2
    assert p2p_channels(1 << 20, 2, 16, step) == 8  # fewer ranks: more channels per peer
    assert p2p_protocol(P2P_LL_THRESHOLD, 8, 16, step) == "ll"
    assert p2p_protocol(P2P_LL_THRESHOLD + 1, 8, 16, step) == "simple"
    assert p2p_protocol(100_000, 2, 16, step) == "simple"  # 2 channels: LL only up to 32 KiB


def test_small_nccl_sends_run_ll_and_it_changes_the_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """At one token per rank every send is LL (no fence, no flag round trip): forcing
    Simple (threshold 0) changes the time, and with 2 KiB rows (a send's bytes well under
    the threshold) LL is the faster, which is why NCCL picks it there; at 1,024 tokens
    nothing is LL, so the threshold changes nothing. (Our crossover lies below NCCL's
    16 KiB per channel: docs/moe.md, "NCCL's all-to-all protocols".)"""
    from cais.experiments.ep import run_ep
    from cais.kernels import ep_nccl

    cfg = load_system("dgx-h100")
    small_ll = run_ep(cfg, "nccl", "dispatch", 1, 1024, 8, 256)
    wide_ll = run_ep(cfg, "nccl", "dispatch", 1, 7168, 8, 256)
    big = run_ep(cfg, "nccl", "dispatch", 1024, 7168, 8, 256)
    monkeypatch.setattr(ep_nccl, "P2P_LL_THRESHOLD", 0)
    small_simple = run_ep(cfg, "nccl", "dispatch", 1, 1024, 8, 256)
    wide_simple = run_ep(cfg, "nccl", "dispatch", 1, 7168, 8, 256)
    big_simple = run_ep(cfg, "nccl", "dispatch", 1024, 7168, 8, 256)
    assert small_ll.time_us < small_simple.time_us
    assert wide_ll.time_us != wide_simple.time_us
    assert big.time_us == big_simple.time_us


def test_the_ll_combine_diagnosis_in_the_docs_is_the_scripts_output() -> None:
    """docs/moe.md's head-of-line blocking figures come from scripts/ll_combine_hol.py
    on the current code; the presets' VC per destination must be faster than a VC per
    class, whose telemetry shows the blocking."""
    import importlib.util
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("ll_combine_hol", root / "scripts" / "ll_combine_hol.py")
    assert spec and spec.loader
    hol = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hol)
    d = hol.diagnose(128)
    page = (root / "docs" / "moe.md").read_text()
    said = dict(re.findall(r"<!-- hol:(\w+) -->(.*?)<!-- /hol -->", page))
    assert said == {"combine": f"{d['combine_by_class_us']:.1f}", "busy": f"{d['busy_destinations_first_half']:.1f}",
                    "busiest": f"{100 * d['busiest_down_link_first_half']:.0f}",
                    "full": f"{d['input_vcs_full']} of {d['input_vcs_used']}",
                    "voq": f"{d['combine_us']:.1f}"}
    assert d["combine_us"] < 0.7 * d["combine_by_class_us"]
    assert d["busy_destinations_first_half"] < 4 and d["input_vcs_full"] > 0


def test_publish_splices_the_block_and_refuses_a_failed_analysis(tmp_path) -> None:
    from cais.reproduce.publish import publish, splice

    assert splice("a <!-- b -->old<!-- e --> z", "<!-- b -->", "<!-- e -->", "new") == "a <!-- b -->\nnew\n<!-- e --> z"
    page = tmp_path / "page.md"
    page.write_text("head\n<!-- b -->\nold\n<!-- e -->\ntail\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "report.md").write_text("r")
    publish("x", "block", tmp_path, page, "<!-- b -->", "<!-- e -->", "docs block")
    assert page.read_text() == "head\n<!-- b -->\ndocs block\n<!-- e -->\ntail\n"
    assert (tmp_path / "x.md").read_text() == "block\n"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "report.md").exists()
    with pytest.raises(SystemExit, match="^x: the analysis failed"):
        publish("x", "ANALYSIS FAILED on these runs", tmp_path, page, "<!-- b -->", "<!-- e -->", "")


def test_fused_in_switch_schemes_run_dispatch_experts_and_combine_as_one_kernel(tmp_path) -> None:
    """ep-switch (fused) runs each dispatch ... combine block as one kernel per GPU: its
    time is reported as fused, its dispatch and combine as 0; in training the weight
    gradients still run as grouped GEMMs after it; ep-switch-unfused runs the phases
    apart and fuses nothing; the fusion changes the layer's time."""
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    runs = {(s, mode): LayerSpec(str(path), s, mode, attention="dp").run()
            for s in ("ep-switch", "ep-switch-unfused") for mode in ("prefill", "train")}
    for mode in ("prefill", "train"):
        fused, apart = runs[("ep-switch", mode)].moe, runs[("ep-switch-unfused", mode)].moe
        assert fused is not None and apart is not None
        assert fused["fused_us"] > 0 and fused["dispatch_us"] == fused["combine_us"] == 0
        assert apart["fused_us"] == 0 and apart["dispatch_us"] > 0 and apart["combine_us"] > 0
        assert runs[("ep-switch", mode)].total_us != runs[("ep-switch-unfused", mode)].total_us
    assert runs[("ep-switch", "prefill")].moe["grouped_gemm_us"] == 0  # type: ignore[index]
    assert runs[("ep-switch", "train")].moe["grouped_gemm_us"] > 0  # type: ignore[index]  # the weight gradients


def test_a_fused_block_is_only_dispatch_expert_steps_and_combine() -> None:
    from cais.schemes.ep import EpScheme

    d, c = MoeStep("dispatch", "exchange", "dispatch"), MoeStep("combine", "exchange", "combine")
    fc1, act = MoeStep("fc1", "grouped_gemm", "fc1", "fwd"), MoeStep("act", "expert_act", "act")
    wg = MoeStep("fc1_wgrad", "grouped_gemm", "fc1", "wgrad")
    inner, after, end = EpScheme._fused_block([d, fc1, act, wg, c, fc1], 1)  # type: ignore[misc]
    assert inner == [fc1, act] and after == [wg] and end == 5
    assert EpScheme._fused_block([d, fc1, MoeStep("p", "permute", "permute"), c], 1) is None
    assert EpScheme._fused_block([d, c], 1) is None  # nothing to fuse
    assert EpScheme._fused_block([d, fc1], 1) is None  # no combine closes it


def test_routing_setting_default_is_the_old_draw_and_a_skew_moves_the_busiest_rank() -> None:
    """``moe.routing`` (cais.config.MoeConfig) reaches the layer path as ``cais run --set``
    gives it: unset and ``uniform`` draw the same routing as before the setting; a
    power-law draw loads the busiest rank more and moves the layer's time; ``moe.seed``
    draws another routing."""
    from cais.experiments.spec import SystemSpec

    def run(**sets: str):  # type: ignore[no-untyped-def]
        spec = LayerSpec("deepseek-v3", "ep-deepep", "decode", SystemSpec("dgx-h100", sets=sets, set_label="--set"),
                         batch=32, seq=64, attention="dp")
        r = spec.run()
        assert r.moe is not None
        return r

    base = run()
    assert base.moe is not None and base.moe["routing"] == "uniform"
    before = build_moe_period(load_moe_model("deepseek-v3", batch=32, seq=64), 8, "decode", "dp").routing
    assert before is not None and base.moe["send_matrix_expert"] == before.matrix("expert").tolist()
    same = run(**{"moe.routing": "uniform"})
    assert same.total_us == base.total_us and same.moe["received_rows"] == base.moe["received_rows"]
    skew = run(**{"moe.routing": "powerlaw"})
    assert skew.moe is not None and skew.moe["routing"] == "powerlaw"
    assert max(skew.moe["received_rows"]) > max(base.moe["received_rows"])
    assert skew.moe["imbalance_expert"] > base.moe["imbalance_expert"]
    assert skew.total_us != base.total_us
    assert sum(skew.moe["received_rows"]) == sum(base.moe["received_rows"]) == 8 * 32 * 8  # every row, once
    other = run(**{"moe.seed": "3"})
    assert other.moe is not None and other.moe["received_rows"] != base.moe["received_rows"]
    steeper = run(**{"moe.routing": "powerlaw", "moe.alpha": "2.5"})
    assert steeper.moe is not None and max(steeper.moe["received_rows"]) > max(skew.moe["received_rows"])


def test_a_bad_routing_setting_is_one_line_naming_the_field_and_its_values() -> None:
    from cais.config import ConfigError, apply_overrides

    cfg = load_system("dgx-h100")
    for key, value, want in (("moe.routing", "zipf", "'uniform', 'powerlaw' or 'lognormal'"),
                             ("moe.alpha", "-1", "greater than or equal to 0"), ("moe.seed", "x", "integer")):
        with pytest.raises(ConfigError) as e:
            apply_overrides(cfg, {key: value})
        assert key in str(e.value) and want in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert apply_overrides(cfg, {"moe.routing": "lognormal"}).moe.generator_kwargs() == {"sigma": 1.0}


def test_a_routing_setting_on_a_dense_run_is_a_warning() -> None:
    from cais.config import apply_overrides
    from cais.experiments.layer import mode_notes

    cfg = load_system("dgx-h100")
    assert not [k for k in mode_notes(get_scheme("tp-nvls"), cfg, "prefill") if k.startswith("moe.")]
    notes = mode_notes(get_scheme("tp-nvls"), apply_overrides(cfg, {"moe.routing": "powerlaw", "moe.seed": "2"}),
                       "prefill")
    assert set(k for k in notes if k.startswith("moe.")) == {"moe.routing", "moe.seed"}
    assert "has no effect" in notes["moe.routing"] and "dense" in notes["moe.routing"]


def _script(name: str):
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _block(tag: str) -> str:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "moe.md").read_text()
    return page.split(f"<!-- {tag} -->", 1)[1].split(f"<!-- /{tag} -->", 1)[0].strip()


def test_the_ll_combine_budget_in_the_docs_is_the_scripts_output() -> None:
    """docs/moe.md's budget of the low-latency combine is scripts/ll_combine_hol.py
    --budget on the current code; the presets' queue per destination takes the combine
    far below a VC per class and below queues shared by peers, more VCs used per class
    change nothing, and the receive side is the same in every case."""
    hol = _script("ll_combine_hol")
    bound, rows = hol.link_bound_us(128), hol.budget(128)
    assert _block("llb:budget") == hol.budget_doc(bound, rows)
    t = {k: v["combine_us"] for k, v in rows.items()}
    assert t["class_18"] == t["class_8"]  # more VCs, still one per class, change nothing
    assert t["presets"] < t["destination_16"] < t["destination_8"] < 0.8 * t["class_8"]  # fewer shared queues
    assert t["presets"] < t["destination_same_buffer"]  # each queue needs its depth
    assert len({round(v["after_sent_us"], 2) for v in rows.values()}) == 1
    ideal = bound["launch_us"] + bound["fixed_us"] + bound["links_us"] + bound["reduce_us"]
    assert ideal < t["presets"] < 1.1 * 114.0  # 114 us: DeepEP's published combine, its fit row's 10 %


def test_the_write_response_table_in_the_docs_is_the_scripts_output() -> None:
    """docs/moe.md's write-response table (scripts/write_ack_counterfactual.py --doc):
    each DeepEP cell rerun at its packet format's refitted SM rate and the NVL chunk the
    script found best (the comment under the table), the NCCL all-to-all row and the
    1 GiB AllReduce rows rerun as they stand; the production figures rerun for posted
    writes and 2-flit responses. Responses must slow the dense ring."""
    import re
    from pathlib import Path

    from cais.kernels.ep_common import ep_constants

    w = _script("write_ack_counterfactual")
    table = _block("wack:table")
    chunks = dict(part.strip().split(" ", 1) for part in
                  re.search(r"<!-- wack:chunks (.*?) -->", table)[1].split(";"))
    lines = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| packet")]
    by_name = {v: k for k, v in w.DOC_NAMES.items()}
    deepep, nccl = w.published_rows("deepep"), w.published_rows("nccl")
    ring = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        variant = by_name[cells[0]]
        rate = float(cells[1].split()[0])
        got = []
        for r, c in zip(deepep, chunks[variant].split()):
            ours, _ = w.run_row(r, variant, rate, int(c))
            got.append(f"{100 * (ours / float(r['published']) - 1):+.1f} %")
        ours, _ = w.run_row(nccl[0], variant, ep_constants().sm_copy_GBps)
        got.append(f"{100 * (ours / float(nccl[0]['published']) - 1):+.1f} %")
        cfg = w.system("dgx-h100", 8, variant)
        for algo in ("ring", "nvls"):
            bus = w.dense_busbw(cfg, "allreduce", algo, 1)
            got.append(f"{100 * (bus / w.DENSE_REFERENCE[('allreduce', algo)] - 1):+.1f} %")
        assert cells[2:] == got, variant
        ring[variant] = float(cells[-2].split()[0])
    assert ring["ack1"] < ring["posted"] - 5 and ring["ack2"] < ring["ack1"]
    assert abs(ring["hdr_ack1"] - ring["posted"]) < 1
    page = (Path(__file__).resolve().parents[1] / "docs" / "moe.md").read_text()
    said = dict(re.findall(r"<!-- wack:prod_(\w+) -->(.*?)<!-- /wack -->", page))
    assert said == {v: f"{100 * w.production_table(v)['scored']['mean_error']:.1f}" for v in ("posted", "ack2")}


def test_a_combines_span_holds_its_wait_for_the_slowest_ranks_experts() -> None:
    """docs/moe.md's figures for deepseek-v3 decode at one token per rank under ep-deepep:
    the combine's span (first start to last end over the GPUs) is mostly the wait for the
    ranks' grouped GEMMs, its kernel's own TB time a small part of it."""
    cfg = load_system("dgx-h100")
    r = run_layer(cfg, load_moe_model("deepseek-v3", batch=8), "ep-deepep", "decode")
    assert r.moe is not None and r.moe["tokens_per_rank"] == 1
    span = float(r.moe["combine_us"])
    tb = r.kernel_tbs["deepep-combine"]["tb_us"] if "deepep-combine" in r.kernel_tbs else None
    assert tb is not None and 0 < tb < span / 5
    text = (Path(__file__).resolve().parents[1] / "docs" / "moe.md").read_text()
    m = re.search(r"under ep-deepep reads ([\d.]+) us of combine, of which its kernel's TBs take ([\d.]+) us", text)
    assert m, "docs/moe.md no longer states the combine's span"
    assert (float(m[1]), float(m[2])) == (round(span, 1), round(tb, 1))
