import json

import pytest

from cais.workload.models import ModelError, ModelSpec, from_hf_config, list_models, load_model

PRESETS = ["paper-mega-gpt-4b", "paper-mega-gpt-8b", "paper-llama-7b", "paper-full", "paper-half",
           "gpt3-175b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "llama3-405b-tp72"]


def test_zoo_is_exactly_the_presets():
    assert sorted(list_models()) == sorted(PRESETS)
    assert all(list_models().values()), "every preset has a description"


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_and_splits_over_8(name):
    m = load_model(name)
    assert m.name == name
    m.check_tp(8)  # every preset divides over 8 GPUs (Mega-GPT-4B: 24 heads = 3 per rank)
    assert m.params_per_layer > 0


@pytest.mark.parametrize("name, shape", [
    ("paper-mega-gpt-4b", (2048, 8192, 24, 1024, 16)),
    ("paper-mega-gpt-8b", (3072, 12288, 32, 1024, 12)),
    ("paper-llama-7b", (4096, 11264, 32, 3072, 3)),
    ("paper-half", (4096, 11264, 32, 3072, 3)),
    ("paper-full", (8192, 22528, 64, 3072, 3)),
])
def test_paper_tables(name, shape):
    m = load_model(name)
    assert (m.hidden, m.ffn_hidden, m.heads, m.seq, m.batch) == shape
    assert (m.gated_mlp, m.norm, m.activation, m.kv) == (False, "layernorm", "gelu", m.heads)


def test_table_i_tokens_and_24_heads():
    assert [load_model(n).tokens for n in PRESETS[:3]] == [16384, 12288, 9216]
    m = load_model("paper-mega-gpt-4b")
    assert m.dim == 85 and m.q_width == 2040  # 2048 // 24; q_width != hidden


def test_half_equals_llama_7b():
    a, b = load_model("paper-half").model_dump(), load_model("paper-llama-7b").model_dump()
    for d in (a, b):
        d.pop("name"), d.pop("description")
    assert a == b


def test_llama3_70b_gqa():
    m = load_model("llama3-70b")
    assert (m.kv, m.dim, m.q_width, m.kv_width) == (8, 128, 8192, 1024)
    assert m.gated_mlp and m.norm == "rmsnorm"
    assert m.check_tp(8) == ""
    note = m.check_tp(16)  # 8 KV heads over 16 ranks: replicated twice
    assert "replicated on 2" in note


def test_params_per_layer_llama2_70b():
    m = load_model("llama2-70b")
    assert m.params_per_layer == 8192 * (8192 + 2 * 1024) + 8192 * 8192 + 3 * 8192 * 28672
    assert m.params_per_layer == pytest.approx(0.86e9, rel=0.01)
    # whole model ~ 68.4e9 without embeddings/norms
    assert m.params_per_layer * m.layers == pytest.approx(68.4e9, rel=0.01)


def test_gpt3_params():
    m = load_model("gpt3-175b")
    assert m.params_per_layer == 12 * 12288**2
    assert m.params_per_layer * m.layers == pytest.approx(174e9, rel=0.01)


def test_check_tp_errors_one_line():
    m = load_model("paper-mega-gpt-8b")
    with pytest.raises(ValueError, match="heads 32") as e:
        m.check_tp(3)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="kv_heads 8"):
        load_model("llama3-8b").check_tp(6)
    assert load_model("llama3-8b", seq=4100).check_tp(8) == ""  # tokens need not divide: SP pads them


def test_with_run_and_overrides():
    m = load_model("llama3-8b")
    r = m.with_run(batch=4, seq=1024)
    assert (r.batch, r.seq, r.tokens, m.batch) == (4, 1024, 4096, 1)
    assert load_model("llama3-8b", batch=2, seq=None).batch == 2
    with pytest.raises(ValueError):
        m.with_run(batch=0)


def test_unknown_name_one_line():
    with pytest.raises(ModelError) as e:
        load_model("gpt-9")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model: unknown model 'gpt-9'; valid: ")
    assert all(n in msg for n in PRESETS)


@pytest.mark.parametrize("field, value, expect", [
    ("norm", "batchnorm", "'layernorm' or 'rmsnorm'"),
    ("heads", 0, "greater than 0"),
    ("kv_heads", 5, "kv_heads (5) must divide heads (32)"),
    ("bogus", 1, "Extra inputs"),
])
def test_bad_field_named(field, value, expect):
    with pytest.raises(ModelError) as e:
        load_model("llama3-8b", **{field: value})
    msg = str(e.value)
    assert field in msg and expect in msg and "\n" not in msg


def test_user_json_file(tmp_path):
    spec = load_model("llama3-8b").model_dump()
    spec.update(name="mine", layers=2)
    p = tmp_path / "mine.json"
    p.write_text(json.dumps(spec))
    assert load_model(str(p)).layers == 2


LLAMA3_8B_HF = {
    "_name_or_path": "meta-llama/Meta-Llama-3-8B", "architectures": ["LlamaForCausalLM"],
    "model_type": "llama", "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "vocab_size": 128256, "torch_dtype": "bfloat16",
}
GPT2_HF = {"model_type": "gpt2", "activation_function": "gelu_new", "n_embd": 768, "n_head": 12,
           "n_layer": 12, "n_inner": None, "n_positions": 1024, "vocab_size": 50257}


def test_hf_llama3(tmp_path):
    d = tmp_path / "Meta-Llama-3-8B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA3_8B_HF))
    m = from_hf_config(d / "config.json", seq=8192)
    ref = load_model("llama3-8b")
    for f in ("hidden", "ffn_hidden", "heads", "layers", "gated_mlp", "norm", "activation", "vocab", "seq"):
        assert getattr(m, f) == getattr(ref, f), f
    assert (m.kv, m.dim, m.name) == (8, 128, "Meta-Llama-3-8B")
    # load_model accepts the file or its folder; run shape overrides apply
    assert load_model(str(d), seq=1024, batch=2).tokens == 2048
    assert from_hf_config(LLAMA3_8B_HF).seq == 2048  # max_position_embeddings is not the run shape


def test_hf_gpt2(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(GPT2_HF))
    m = from_hf_config(p, name="gpt2")
    assert (m.hidden, m.ffn_hidden, m.heads, m.kv, m.layers) == (768, 3072, 12, 12, 12)
    assert (m.gated_mlp, m.norm, m.activation, m.vocab) == (False, "layernorm", "gelu", 50257)
    m.check_tp(4)


def test_hf_opt_and_missing_key():
    opt = {"model_type": "opt", "hidden_size": 2048, "ffn_dim": 8192, "num_attention_heads": 32,
           "num_hidden_layers": 24, "activation_function": "relu", "vocab_size": 50272}
    m = from_hf_config(opt, name="opt-1.3b")
    assert (m.ffn_hidden, m.activation, m.norm) == (8192, "gelu", "layernorm")
    bad = {k: v for k, v in LLAMA3_8B_HF.items() if k != "num_attention_heads"}
    with pytest.raises(ModelError, match="missing key 'num_attention_heads'") as e:
        from_hf_config(bad)
    assert "\n" not in str(e.value)


MIXTRAL_HF = {
    "_name_or_path": "mistralai/Mixtral-8x7B-v0.1", "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "vocab_size": 32000,
    "num_local_experts": 8, "num_experts_per_tok": 2,
}


@pytest.mark.parametrize("key, extra", [
    ("num_local_experts", {}),  # Mixtral
    ("n_routed_experts", {"n_routed_experts": 64, "n_shared_experts": 2}),  # DeepSeek-V2/V3
    ("num_experts", {"num_experts": 60, "moe_intermediate_size": 1408}),  # Qwen-MoE, OLMoE
])
def test_hf_mixture_of_experts_is_refused_not_run_as_dense(tmp_path, key, extra):
    """Issue 59: a MoE config ran silently as a dense model; it is refused in one line
    naming the key, saying what is modelled."""
    cfg = {k: v for k, v in MIXTRAL_HF.items() if k != "num_local_experts" or key == "num_local_experts"} | extra
    d = tmp_path / "moe"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    for load in (lambda: from_hf_config(cfg), lambda: load_model(str(d))):
        with pytest.raises(ModelError) as e:  # a UserError: exit 2 on the command line
            load()
        msg = str(e.value)
        assert "\n" not in msg and f"field '{key}'" in msg and "mixture-of-experts" in msg
        assert "dense decoder layers" in msg and "absent or 1" in msg
    assert from_hf_config({**cfg, key: 1}).ffn_hidden == 14336  # one expert is a dense MLP


def test_spec_is_frozen():
    m = load_model("llama3-8b")
    with pytest.raises(Exception):
        m.hidden = 1
    assert isinstance(m, ModelSpec)


@pytest.mark.parametrize("name, degrees", [
    ("llama3-405b", [16, 32, 64]), ("llama3-70b", [16, 32, 64]), ("paper-full", [16, 32, 64]),
    ("llama3-405b-tp72", [16, 24, 48, 72])])
def test_large_tp_splits(name, degrees):
    m = load_model(name)
    for n in degrees:
        note = m.check_tp(n)
        assert ("replicated" in note) == (m.kv < n)
    assert set(degrees) <= set(m.tp_degrees())


def test_large_tp_error_names_the_constraint_and_the_allowed_degrees():
    with pytest.raises(ModelError) as exc:
        load_model("llama3-405b").check_tp(72)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg == ("llama3-405b: TP=72 does not divide heads 128, ffn_hidden 53248; "
                   "the TP degrees it allows: 1, 2, 4, 8, 16, 32, 64, 128")
