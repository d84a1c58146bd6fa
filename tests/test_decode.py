"""Decode (and any run whose token rows do not split over the GPUs) with sequence
parallelism: the token rows are padded up to a multiple of the GPU count, the padding
is costed like real rows, and the real rows stay exact (docs/layer-semantics.md)."""

import json

import numpy as np
import pytest

from cais.cli import main
from cais.experiments.layer import _matches, run_layer
from cais.config import load_system
from cais.schemes import get_scheme, schemes
from cais.workload import numerics as nx
from cais.workload.dims import dims_for
from cais.workload.models import list_models, load_model
from test_schemes import GPT, LLAMA

SMS = 66  # the paper's scaled runs: the same kernels, half the TBs to simulate
SP_SCHEMES = [s for s in schemes() if get_scheme(s).sp]


@pytest.fixture(scope="module")
def four_gpus():
    return load_system("dgx-h100").with_overrides(gpus=4)


@pytest.mark.parametrize("scheme", list(schemes()))
@pytest.mark.parametrize("name", list(list_models()))
def test_decode_runs_for_every_scheme_and_preset(h100, name, scheme) -> None:
    model = load_model(name)  # its default batch: 1, 3, 12 or 16 sequences over 8 GPUs
    # the 405B-class models' bf16 weights (102 and 120 GB per GPU at TP 8) fit 8 H200s, not 8 H100s (docs/memory.md)
    cfg = load_system("dgx-h200") if name.startswith("llama3-405b") else h100
    r = run_layer(cfg, model, scheme, "decode", SMS)
    assert r.total_us > 0 and set(r.sublayers) == {"L1", "L2"}
    assert r.tokens == model.batch
    assert r.padded_tokens % r.gpus == 0 if get_scheme(scheme).sp else r.padded_tokens == model.batch
    assert r.padded_tokens - r.tokens < r.gpus
    out = r.as_json()
    assert (out["tokens"], out["padded_tokens"]) == (r.tokens, r.padded_tokens)


def test_dims_pad_token_rows_only_with_sp() -> None:
    m = load_model("paper-llama-7b")  # batch 3, seq 3072
    d = dims_for(m, 8, "decode", sp=True)
    assert (d.tokens, d.real_tokens, d.pad, d.rows_l, d.batch, d.seq) == (8, 3, 5, 1, 3, 1)
    d = dims_for(m, 8, "decode", sp=False)
    assert (d.tokens, d.pad, d.rows_l) == (3, 0, 3)
    d = dims_for(m.with_run(seq=1001), 8, "train", sp=True)  # training pads the same way
    assert (d.real_tokens, d.tokens, d.rows_l) == (3003, 3008, 376)
    assert dims_for(m, 8, "prefill", sp=True).pad == 0


@pytest.mark.parametrize("scheme", SP_SCHEMES)
def test_padded_rows_cost_what_real_rows_cost(h100, scheme) -> None:
    """Batch 3 padded to 8 moves and computes what batch 8 does between the GEMMs
    (the same sub-layer times, the same bytes on every wire); only attention, which
    runs on the real sequences, is cheaper. Its smaller HBM traffic may leave a phase
    after it a few picoseconds less stretched (shared HBM), hence 1e-5."""
    model = load_model("paper-llama-7b")
    padded, full = (run_layer(h100, model.with_run(batch=b), scheme, "decode", SMS) for b in (3, 8))
    assert padded.padded_tokens == full.padded_tokens == 8
    assert padded.sublayers.keys() == full.sublayers.keys()
    for name, sub in full.sublayers.items():
        assert padded.sublayers[name] == {k: pytest.approx(v, rel=1e-5) for k, v in sub.items()}, name
    assert padded.metrics.as_json()["wire_bytes"] == full.metrics.as_json()["wire_bytes"]
    assert padded.segments["attention"] < full.segments["attention"]


@pytest.mark.parametrize("scheme", list(schemes()))
def test_decode_with_a_batch_that_does_not_split_is_exact(four_gpus, scheme) -> None:
    for model in (GPT.with_run(batch=6), LLAMA.with_run(batch=3)):  # 6 -> 8 rows; 3 -> 4 (one row per GPU)
        r = run_layer(four_gpus, model, scheme, "decode", functional=True, seed=3)
        assert r.checked >= 28 and r.mismatches == [], (model.name, r.mismatches)
        assert r.tokens == model.batch
        assert r.padded_tokens == ({6: 8, 3: 4}[model.batch] if get_scheme(scheme).sp else model.batch)


@pytest.mark.parametrize("scheme", list(schemes()))
def test_train_with_tokens_that_do_not_split_is_exact(four_gpus, scheme) -> None:
    model = GPT.with_run(batch=1, seq=15)  # 15 token rows -> 16
    r = run_layer(four_gpus, model, scheme, "train", functional=True, seed=4)
    assert r.checked >= 60 and r.mismatches == [], r.mismatches
    assert (r.tokens, r.padded_tokens) == (15, 16 if get_scheme(scheme).sp else 15)


def test_norms_of_a_zero_row_are_finite() -> None:
    """A padded row enters the first norm as zeros: eps keeps it finite (LayerNorm
    gives beta, RMSNorm zero), and its backward with a zero gradient is zero."""
    h = 64
    zero, gamma, beta = np.zeros((1, h)), np.full(h, 1.03125), np.full(h, 0.0625)
    assert np.array_equal(nx.layernorm(zero, gamma, beta), beta[None])
    assert np.array_equal(nx.rmsnorm(zero, gamma), zero)
    for kind in ("layernorm", "rmsnorm"):
        dx, dg, db = nx.norm_bwd(kind, zero, zero, gamma)
        assert not dx.any() and not dg.any() and (db is None or not db.any())


def test_the_checker_skips_padded_rows_but_guards_them() -> None:
    want = np.array([[1.0, 2.0], [np.nan, np.nan]])  # row 1 is padding
    assert _matches("x3", np.array([[1.0, 2.0], [7.0, -3.0]]), want)
    assert not _matches("x3", np.array([[1.0, 2.5], [7.0, -3.0]]), want)  # a real row differs
    assert not _matches("x3", np.array([[1.0, 2.0], [np.inf, 0.0]]), want)  # padding not finite
    assert not _matches("dx3", np.array([[1.0, 2.0], [0.0, 1.0]]), want)  # a gradient of padding not zero
    assert _matches("dx3", np.array([[1.0, 2.0], [0.0, 0.0]]), want)


def test_cli_decode_of_a_preset_reports_the_padding(capsys) -> None:
    args = ["run", "--model", "paper-llama-7b", "--scheme", "sp-nvls", "--mode", "decode", "--sms", str(SMS)]
    assert main(args) == 0
    assert "3 token rows padded to 8" in " ".join(capsys.readouterr().out.split())  # the title, maybe wrapped
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["tokens"], out["padded_tokens"]) == (3, 8)
    assert main(["run", "--model", "paper-llama-7b", "--scheme", "tp-nvls", "--mode", "decode", "--sms", str(SMS)]) == 0
    assert "padded" not in capsys.readouterr().out  # basic TP needs no padding


def test_decode_step_small_kernels_and_token_time() -> None:
    """Decode under a CUDA graph: rotary and the KV-cache write run as kernels of their
    own before attention, attention has its sourced floor, and the JSON gives the
    whole model's time per output token: layers x the period + the tail."""
    from cais.config import apply_overrides

    cfg = apply_overrides(load_system("dgx-h100"), {"gpu.launch": "graph"})
    model = load_model("llama3-8b").with_run(1, 1024)
    r = run_layer(cfg, model, "tp-vllm", "decode", 132)
    names = set(r.kernel_tbs)
    assert {"rotary", "kv_write", "attention"} <= names
    assert r.segments["attention"] >= cfg.gpu.attn_decode_floor_us  # the floor, then the cache read
    assert r.token is not None
    tok = r.as_json()
    assert tok["token_us"] == r.token.layers * r.total_us + r.token.tail_us
    assert r.token.layers == 32 and set(r.token.tail) == {"embedding", "final_norm", "lm_head", "logits_gather",
                                                          "sampling"}
    # lm_head: 128256 / 8 x 4096 bf16 weights (131 MB) read at the calibrated ~3.0 TB/s, at least
    assert 40 < r.token.tail["lm_head"] < 60
    # a longer context reads more cache: only attention (and the period) grow
    longer = run_layer(cfg, load_model("llama3-8b").with_run(1, 32768), "tp-vllm", "decode", 132)
    assert longer.segments["attention"] > r.segments["attention"]
    # the fitted launch keeps the paper-era decode layer: no rotary or cache-write kernels
    fitted = run_layer(load_system("dgx-h100"), model, "tp-vllm", "decode", 132)
    assert "rotary" not in fitted.kernel_tbs and fitted.token is not None


def test_split_gemms_off_gives_the_data_parallel_decode_layer() -> None:
    """gpu.split_gemms=false: the decode GEMMs run one CTA per tile over the whole K,
    so the same period takes longer (the model before splits)."""
    from cais.config import apply_overrides

    model = load_model("llama3-8b").with_run(1, 1024)
    on = apply_overrides(load_system("dgx-h100"), {"gpu.launch": "graph"})
    off = apply_overrides(on, {"gpu.split_gemms": "false"})
    t_on = run_layer(on, model, "tp-vllm", "decode", 132).total_us
    t_off = run_layer(off, model, "tp-vllm", "decode", 132).total_us
    assert t_off > 1.3 * t_on


def test_graph_batch_pads_to_the_captured_sizes() -> None:
    """The captured sizes vLLM and SGLang share: 1, 2, 4, then multiples of 8 (of 16
    past 256); a batch past the largest runs as it is."""
    from cais.experiments.token import graph_batch

    got = {b: graph_batch(b) for b in (1, 2, 3, 4, 5, 6, 8, 9, 17, 256, 257, 512, 513)}
    assert got == {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 6: 8, 8: 8, 9: 16, 17: 24, 256: 256, 257: 272, 512: 512, 513: 513}
    with pytest.raises(ValueError):
        graph_batch(0)


def test_a_decode_graph_runs_the_padded_batch_and_the_tail_outside_it_the_real_one() -> None:
    """Batch 6 under a CUDA graph runs the graph of 8: the layer's rows are 8 (6 real),
    the KV bytes stay the real sequences' (the padding sequences hold one token), the
    in-graph tail parts run 8 rows and the lm_head, gather and sampler 6; with
    ``decode.graph_padding`` off the same run is the graph of 6."""
    from cais.config import apply_overrides
    from cais.experiments.token import IN_GRAPH, graph_padded

    cfg = apply_overrides(load_system("dgx-h100"), {"gpu.launch": "graph"})
    model = load_model("llama3-8b").with_run(6, 133)
    padded = run_layer(cfg, model, "tp-custom-ar", "decode", 132)
    exact = run_layer(apply_overrides(cfg, {"decode.graph_padding": "false"}), model, "tp-custom-ar", "decode", 132)
    eight = run_layer(cfg, graph_padded(model, 8), "tp-custom-ar", "decode", 132)
    assert padded.token is not None and exact.token is not None and eight.token is not None
    assert (padded.tokens, padded.padded_tokens, padded.token.graph_batch) == (6, 8, 8)
    assert (exact.tokens, exact.padded_tokens, exact.token.graph_batch) == (6, 6, 0)
    assert "graph_batch" in padded.as_json()["token"] and "graph_batch" not in exact.as_json()["token"]
    kv = graph_padded(model, 8)
    assert abs(kv.batch * kv.seq - (6 * 133 + 2)) <= kv.batch / 2  # the real cache plus one token per padding row
    assert padded.total_us == eight.total_us > exact.total_us  # the period is the graph of 8's
    for part in IN_GRAPH:
        assert padded.token.tail[part] == eight.token.tail[part]
    for part in ("lm_head", "logits_gather", "sampling"):
        assert padded.token.tail[part] == exact.token.tail[part] < eight.token.tail[part] + 1e-9
    assert padded.token.tail["sampling"] < eight.token.tail["sampling"]  # 6 rows' logits, not 8


def test_the_vllm_06_stack_adds_its_kernels_to_the_decode_step() -> None:
    """``decode.stack`` = vllm-0.6: the attention's output copy runs as a kernel of its
    own after attention in every layer, and the tail has vLLM 0.6's parts in order,
    each at least one small kernel's floor; the generic stack's tail keeps its parts."""
    from cais.config import apply_overrides
    from cais.experiments.token import PARTS, VLLM06_PARTS

    cfg = apply_overrides(load_system("dgx-h100"), {"gpu.launch": "graph"})
    model = load_model("llama3-8b").with_run(1, 610)
    generic = run_layer(cfg, model, "tp-custom-ar", "decode", 132)
    vllm = run_layer(apply_overrides(cfg, {"decode.stack": "vllm-0.6"}), model, "tp-custom-ar", "decode", 132)
    assert generic.token is not None and vllm.token is not None
    assert "attn_out_copy" in vllm.kernel_tbs and "attn_out_copy" not in generic.kernel_tbs
    grew = vllm.segments["attention"] - generic.segments["attention"]
    assert cfg.gpu.small_kernel_us <= grew <= cfg.gpu.small_kernel_us + 2 * cfg.gpu.kernel_gap_us
    assert tuple(generic.token.tail) == PARTS and tuple(vllm.token.tail) == VLLM06_PARTS
    for part in ("graph_inputs", "prune", "token_broadcast", "advance_step"):
        assert vllm.token.tail[part] >= cfg.gpu.small_kernel_us
    for part in ("embedding", "final_norm", "lm_head"):
        assert vllm.token.tail[part] == generic.token.tail[part]
    # six more sampler kernels, each at least its floor; the concatenation after the gather
    assert vllm.token.tail["sampling"] - generic.token.tail["sampling"] >= 6 * cfg.gpu.small_kernel_us
    assert vllm.token.tail["logits_gather"] - generic.token.tail["logits_gather"] >= cfg.gpu.small_kernel_us
