"""Expert tensor parallelism in MoE layers under ``cais run`` (docs/moe.md, "Expert
tensor parallelism"): the routing over (expert, slot) pairs, the grouped rings, the
functional check against the unsharded block, the expert-TP collectives' bytes counted
from the run's own wire telemetry, and the refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cais.config import load_system
from cais.errors import UserError
from cais.experiments import ep
from cais.experiments.layer import run_layer
from cais.experiments.spec import LayerSpec
from cais.kernels.collectives import CollectiveSpec, build
from cais.machine import Machine
from cais.workload.moe import MoeSpec, load_moe_model
from cais.workload.moe_dataflow import build_moe_period
from cais.workload.routing import expert_tp_routing, generate

TINY = {"name": "tiny-moe", "family": "test", "hidden": 128, "heads": 8, "kv_heads": 8, "head_dim": 16, "layers": 2,
        "dense_ffn_hidden": 256, "experts": 16, "topk": 4, "expert_ffn_hidden": 64, "shared_experts": 1,
        "n_group": 4, "topk_group": 2, "seq": 24, "batch": 2}


def test_the_routing_over_slots_keeps_megatrons_layout() -> None:
    """GPU g is EP rank g // tp, slot g % tp; ``group`` keeps a token's slot (the
    all-to-all among one slot's EP ranks), ``all`` sends it to every slot."""
    rt = generate("uniform", 8, 16, 16, 4, 0, ep=4)
    per = 16 // 4
    grp, every = expert_tp_routing(rt, 4, 2, "group"), expert_tp_routing(rt, 4, 2, "all")
    assert grp.experts == every.experts == 32 and grp.per_rank == per and grp.topk == 4 and every.topk == 8
    owner = grp.topk_idx // per  # the GPU each selection goes to
    src = np.arange(8)[:, None, None]
    assert ((owner % 2) == (src % 2)).all()  # same slot as the sender
    assert ((owner // 2) == (rt.topk_idx // per)).all()  # the expert's EP rank
    own = every.topk_idx.reshape(8, 16, 4, 2) // per
    assert ((own[..., 0] // 2) == (own[..., 1] // 2)).all() and ((own[..., 1] - own[..., 0]) == 1).all()
    assert np.array_equal(grp.matrix("expert").sum(), rt.matrix("expert").sum())


def test_the_draw_does_not_depend_on_expert_tp() -> None:
    mm = load_moe_model("qwen3-30b-a3b", seq=64, batch=2)
    a = build_moe_period(mm, 8, "prefill", expert_tp=1).routing
    b = build_moe_period(mm, 8, "prefill", expert_tp=2).routing
    assert a is not None and b is not None
    assert np.array_equal(a.topk_idx // (128 // 8) // 2, b.topk_idx // (128 // 4) // 2)  # same experts' EP ranks


def test_grouped_rings_stay_in_their_groups() -> None:
    """One ring per group: an AllGather over pairs leaves each GPU its pair's shards
    only, and a ReduceScatter sums within the pair."""
    cfg = load_system("dgx-h100")
    m = Machine(cfg, functional=True)
    groups = ((0, 1), (2, 3), (4, 5), (6, 7))
    for g in range(8):
        m.gpus[g].memory.alloc("x", 4, fill=np.full(4, float(g + 1)))
        m.gpus[g].memory.alloc("y", 8)
    for gpu, k in zip(m.gpus, build(m, CollectiveSpec("allgather", "ring", 8, 2, "x", "y", groups=groups))):
        gpu.launch(k, m.launch_ps)
    m.run()
    for g in range(8):
        first = g - g % 2
        assert m.gpus[g].memory.buffers["y"].tolist() == [first + 1.0] * 4 + [first + 2.0] * 4
    with pytest.raises(ValueError, match="groups"):
        build(m, CollectiveSpec("allgather", "nvls", 8, 2, "x", "y", groups=groups))


@pytest.mark.parametrize("expert_tp", [2, 4])
@pytest.mark.parametrize("attention", ["tp", "dp"])
@pytest.mark.parametrize("scheme", ["ep-nccl", "ep-allgather", "ep-deepep"])
def test_functional_expert_tp_equals_the_unsharded_block(scheme: str, attention: str, expert_tp: int,
                                                         tmp_path) -> None:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    r = LayerSpec(str(path), scheme, "prefill", attention=attention, expert_tp=expert_tp).run(functional=True, seed=5)
    assert r.checked == 1 and r.mismatches == []
    assert r.moe is not None and r.moe["ep"] == 8 // expert_tp and r.moe["expert_tp"] == expert_tp


def _tiny_period(expert_tp: int, form: str):
    mm = MoeSpec.model_validate(TINY)
    rt = build_moe_period(mm, 8, "prefill", "dp", expert_tp=expert_tp, form=form).routing
    assert rt is not None
    return mm, rt


def test_without_the_expert_tp_reduce_the_check_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """nccl: the group's ReduceScatter left out (each GPU keeps its own slot's partial
    sums) is caught; allgather / deepep: a routing that reaches one slot only (the
    combine then adds one partial sum per expert) is caught."""
    cfg = load_system("dgx-h100")
    mm, rt = _tiny_period(2, "group")
    assert ep.expert_block_check(cfg, "nccl", mm, rt, 1, expert_tp=2)
    real = ep.expert_tp_rows

    def own_slot_only(cfg_, rows, experts, tp, partial):  # type: ignore[no-untyped-def]
        return [np.array([partial(g % tp, e, row) for e, row in zip(experts[g], rows[g])]).reshape(len(rows[g]), -1)
                for g in range(len(rows))]
    monkeypatch.setattr(ep, "expert_tp_rows", own_slot_only)
    assert not ep.expert_block_check(cfg, "nccl", mm, rt, 1, expert_tp=2)
    monkeypatch.setattr(ep, "expert_tp_rows", real)
    _, every = _tiny_period(2, "all")
    for kernel in ("allgather", "deepep"):
        assert ep.expert_block_check(cfg, kernel, mm, every, 1, expert_tp=2)
        assert not ep.expert_block_check(cfg, kernel, mm, rt, 1, expert_tp=2)


def test_expert_tp_collectives_move_the_expected_bytes_and_change_the_time() -> None:
    """ep-nccl at expert TP 2 and 4 against 1 (dgx-h100, prefill): the wire bytes the run's
    ports counted grow by the expert-TP rings' payload (each GPU sends (tp - 1) shards
    of the largest received share, one AllGather and one ReduceScatter) plus the change
    in the all-to-all's remote rows, at NVLink's write overhead (a 16 B header and a
    16 B write flit per 128 B packet); under ep-allgather (its exchange over every GPU
    already carries every slot) the bytes do not change at all."""
    cfg = load_system("dgx-h100")
    mm = load_moe_model("qwen3-30b-a3b", seq=256, batch=2)
    h, eb = mm.hidden, mm.dtype_bytes
    wire = 1 + (cfg.packet.header_flits + 1) * cfg.packet.flit_bytes / cfg.packet.max_payload_bytes

    def up(r) -> int:  # type: ignore[no-untyped-def]
        return sum(d["up"] for d in r.metrics.wire_bytes.values())

    def remote_rows(r) -> int:  # type: ignore[no-untyped-def]
        mat = np.array(r.moe["send_matrix_expert"])
        return int(mat.sum() - np.trace(mat))
    base = run_layer(cfg, mm, "ep-nccl", "prefill")
    assert base.moe is not None and base.moe["expert_tp_us"] == 0 and "expert_tp_gather" not in base.segments
    for tp in (2, 4):
        r = run_layer(cfg, mm, "ep-nccl", "prefill", expert_tp=tp)
        assert r.moe is not None and r.moe["expert_tp_us"] > 0 and r.total_us != base.total_us
        shard = max(r.moe["received_rows"]) * h * eb
        rings = 8 * 2 * (tp - 1) * shard  # every GPU, AllGather + ReduceScatter
        assert r.moe["expert_tp_bytes"] * 8 == rings
        a2a = 2 * (remote_rows(r) - remote_rows(base)) * h * eb  # dispatch + combine
        assert (up(r) - up(base)) / (rings + a2a) == pytest.approx(wire, rel=0.005)
    ag1 = run_layer(cfg, mm, "ep-allgather", "prefill")
    ag2 = run_layer(cfg, mm, "ep-allgather", "prefill", expert_tp=2)
    assert up(ag1) == up(ag2) and ag2.moe is not None and ag2.moe["expert_tp_us"] == 0


def test_train_runs_the_conjugates() -> None:
    cfg = load_system("dgx-h100")
    r = run_layer(cfg, load_moe_model("qwen3-30b-a3b", seq=64, batch=2), "ep-nccl", "train", expert_tp=2)
    for name in ("expert_tp_gather", "expert_tp_reduce", "expert_tp_reduce_bwd", "expert_tp_gather_bwd"):
        assert r.segments[name] > 0
    assert r.collectives_ran.get("ring/ll", 0) + r.collectives_ran.get("ring/simple", 0) >= 4


@pytest.mark.parametrize("model,scheme,expert_tp,message", [
    ("qwen3-30b-a3b", "ep-nccl", 3, "expert_tp: 3 does not divide the 8 GPUs; allowed: 1, 2, 4, 8"),
    ("qwen3-30b-a3b", "ep-deepep-ll", 2, "expert_tp: EP kernel 'deepep-ll' runs expert_tp 1 only"),
    ("qwen3-30b-a3b", "ep-switch", 2, "expert_tp: EP kernel 'ep-switch' runs expert_tp 1 only"),
    ("llama3-8b", "tp-nvls", 2, "expert_tp: it splits a mixture-of-experts layer's experts"),
])
def test_bad_plans_are_one_line_naming_expert_tp(model: str, scheme: str, expert_tp: int, message: str) -> None:
    with pytest.raises(UserError) as err:
        LayerSpec(model, scheme, "prefill", seq=64, expert_tp=expert_tp).check()
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_expert_tp_must_divide_the_expert_ffn(tmp_path) -> None:
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({**TINY, "expert_ffn_hidden": 100}))
    with pytest.raises(UserError, match=r"^expert_tp: 8 does not divide expert_ffn_hidden \(100\)$"):
        LayerSpec(str(path), "ep-nccl", "prefill", expert_tp=8).check()


def test_cli_expert_tp(capsys: pytest.CaptureFixture[str]) -> None:
    from cais.cli import main

    main(["run", "--model", "qwen3-30b-a3b", "--scheme", "ep-nccl", "--mode", "prefill", "--seq", "64",
          "--expert-tp", "2"])
    out = " ".join(capsys.readouterr().out.split())
    assert "experts: EP 4 x expert TP 2 (expert-TP collectives" in out and "top-8 of 128" in out
    assert main(["run", "--model", "qwen3-30b-a3b", "--scheme", "ep-deepep-ll", "--mode", "decode",
                 "--expert-tp", "2"]) == 2
    assert capsys.readouterr().err.startswith("cais: error: --expert-tp: EP kernel 'deepep-ll'")


def test_the_docs_table_is_the_scripts_output() -> None:
    """docs/moe.md's expert-TP example is scripts/expert_tp_doc.py --doc on the current
    code; expert TP 2 costs ep-nccl its rings and ep-deepep its doubled exchange there."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("expert_tp_doc", root / "scripts" / "expert_tp_doc.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.rows()
    page = (root / "docs" / "moe.md").read_text()
    block = page.split("<!-- etp:table -->", 1)[1].split("<!-- /etp:table -->", 1)[0].strip()
    assert block == mod.doc(rows)
    by = {(r["kernel"], r["expert_tp"]): r for r in rows}
    assert by[("nccl", 2)]["expert-TP collectives"] > 0 and by[("nccl", 2)]["bytes"] > 0
    assert by[("deepep", 2)]["dispatch"] > by[("deepep", 1)]["dispatch"]
    assert by[("allgather", 2)]["bytes"] == by[("deepep", 2)]["bytes"] == 0
