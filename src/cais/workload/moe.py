"""Mixture-of-experts (MoE) models: the shape of one MoE decoder layer, its presets and
its import from Hugging Face ``config.json`` files, and how it is split over GPUs
(expert parallelism).

A MoE layer keeps attention as the dense layers have it and replaces the one dense MLP
by ``experts`` routed expert MLPs (SwiGLU, ``expert_ffn_hidden`` wide), of which each
token visits ``topk``, plus ``shared_experts`` MLPs every token visits. DeepSeek's
group-limited routing first keeps the ``topk_group`` best of ``n_group`` expert groups
and takes the top-k within them. The first ``dense_layers`` layers have a dense MLP of
``dense_ffn_hidden`` (DeepSeek-V3's ``first_k_dense_replace``).

Presets live in ``cais/data/moe-models/`` (:func:`list_moe_models`); ``cais models``
lists them beside the dense presets. The dense path (:mod:`cais.workload.models`) is
unchanged: it still refuses a MoE ``config.json`` rather than import it as one dense MLP.

DeepSeek's multi-head latent attention (MLA) is timed by default as multi-head attention
of ``heads`` heads of ``head_dim`` = ``qk_nope_head_dim + qk_rope_head_dim`` (192): the
per-head score and value widths of MLA's prefill form. Its real shape (``q_lora_rank``,
``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``) is
recorded and counted by the memory footprint (cais.workload.moe_footprint: MLA's
weights and its latent KV cache), and timed where a run asks for MLA's own ops
(``moe.mla_timing`` = ``mla``: cais.workload.mla, cais.workload.moe_dataflow). ``weight_dtype_bytes`` is the weights'
dtype as the model is released (DeepSeek-V3: FP8, 1), used by the footprint only; the
simulated kernels run ``dtype_bytes`` (BF16). docs/moe.md, docs/memory.md.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cais.errors import looks_like_path
from cais.workload.models import MOE_KEYS, AttentionShape, ModelError, _one_line


#: the fields an MLA model must give (DeepSeek's config.json names; q_lora_rank may be None)
MLA_FIELDS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


class MoeSpec(AttentionShape, BaseModel):
    """One MoE decoder layer's shape (attention, routed and shared experts, routing
    groups) plus its default run shape: the model a MoE stack serves or trains."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    family: str
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int | None = Field(None, gt=0)
    head_dim: int | None = Field(None, gt=0)
    layers: int = Field(gt=0)
    vocab: int | None = Field(None, gt=0)
    dense_ffn_hidden: int = Field(gt=0, description="the dense MLP of the first dense_layers layers")
    experts: int = Field(gt=1, description="routed experts per layer")
    topk: int = Field(gt=0, description="routed experts per token")
    expert_ffn_hidden: int = Field(gt=0, description="one routed expert's FFN width (SwiGLU)")
    shared_experts: int = Field(0, ge=0, description="experts every token visits")
    n_group: int = Field(1, gt=0, description="expert groups (group-limited routing)")
    topk_group: int = Field(1, gt=0, description="groups a token may route into")
    dense_layers: int = Field(0, ge=0, description="first layers with a dense MLP")
    attention: Literal["mha", "gqa", "mla"] = "gqa"
    q_lora_rank: int | None = Field(None, gt=0, description="MLA: the query's low rank (None: a full query)")
    kv_lora_rank: int | None = Field(None, gt=0, description="MLA: the compressed KV latent's width")
    qk_nope_head_dim: int | None = Field(None, gt=0, description="MLA: a head's query/key width without RoPE")
    qk_rope_head_dim: int | None = Field(None, gt=0, description="MLA: the shared RoPE key's width")
    v_head_dim: int | None = Field(None, gt=0, description="MLA: a head's value width")
    seq: int = Field(4096, gt=0)
    batch: int = Field(1, gt=0)
    dtype_bytes: int = Field(2, gt=0)
    weight_dtype_bytes: int = Field(2, gt=0, description="bytes per weight as released (FP8: 1); the "
                                                         "memory footprint's only")

    @model_validator(mode="after")
    def _check(self) -> "MoeSpec":
        if self.topk > self.experts:
            raise ValueError(f"topk ({self.topk}) must be at most experts ({self.experts})")
        if self.experts % self.n_group:
            raise ValueError(f"n_group ({self.n_group}) must divide experts ({self.experts})")
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group ({self.topk_group}) must be at most n_group ({self.n_group})")
        if self.n_group > 1 and self.topk > self.topk_group * (self.experts // self.n_group):
            raise ValueError(f"topk ({self.topk}) exceeds the experts of topk_group ({self.topk_group}) groups")
        if self.heads % self.kv:
            raise ValueError(f"kv_heads ({self.kv}) must divide heads ({self.heads})")
        if self.dense_layers >= self.layers:
            raise ValueError(f"dense_layers ({self.dense_layers}) must be fewer than layers ({self.layers})")
        missing = [f for f in MLA_FIELDS if getattr(self, f) is None]
        if self.attention == "mla" and missing:
            raise ValueError(f"attention 'mla' needs {', '.join(missing)}")
        return self

    @property
    def tokens(self) -> int:
        return self.seq * self.batch

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up and down of SwiGLU)."""
        return 3 * self.hidden * self.expert_ffn_hidden

    def active_params_per_layer(self) -> int:
        """MLP weights one token uses in a MoE layer: top-k routed and the shared experts
        (attention not counted)."""
        return (self.topk + self.shared_experts) * self.expert_params()


class EpPlan(BaseModel):
    """How a MoE layer is split over ``gpus`` GPUs: ``ep`` ranks each holding
    ``experts / ep`` routed experts, each expert split ``expert_tp`` ways (expert
    tensor parallelism), and attention under TP (``attention_tp`` ranks) or data
    parallel (``attention_tp`` 1). ``gpus`` = ``ep * expert_tp`` =
    ``attention_tp * attention_dp``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: int = Field(gt=0)
    ep: int = Field(gt=0)
    expert_tp: int = Field(1, gt=0)
    attention_tp: int = Field(1, gt=0)

    @property
    def attention_dp(self) -> int:
        return self.gpus // self.attention_tp

    def check(self, model: MoeSpec) -> "EpPlan":
        """The plan if it splits ``model``; else a ModelError naming the field and what it allows."""
        if self.ep * self.expert_tp != self.gpus:
            raise ModelError(f"ep: ep ({self.ep}) x expert_tp ({self.expert_tp}) must equal gpus ({self.gpus})")
        if self.gpus % self.attention_tp:
            raise ModelError(f"attention_tp: {self.attention_tp} must divide gpus ({self.gpus})")
        if model.experts % self.ep:
            allowed = [k for k in range(1, model.experts + 1) if model.experts % k == 0 and k <= 1024]
            raise ModelError(f"ep: {self.ep} does not divide {model.name}'s {model.experts} experts; "
                             f"allowed: {', '.join(map(str, allowed))}")
        if model.expert_ffn_hidden % self.expert_tp:
            raise ModelError(f"expert_tp: {self.expert_tp} does not divide expert_ffn_hidden "
                             f"({model.expert_ffn_hidden})")
        if model.heads % self.attention_tp or (model.kv >= self.attention_tp and model.kv % self.attention_tp):
            raise ModelError(f"attention_tp: {self.attention_tp} does not divide {model.name}'s heads "
                             f"({model.heads}) and kv_heads ({model.kv})")
        return self

    def experts_per_rank(self, model: MoeSpec) -> int:
        return model.experts // self.ep


# ---------------------------------------------------------------------------------------
# Loading

def _presets_dir() -> Path:
    return Path(str(resources.files("cais") / "data" / "moe-models"))


def list_moe_models() -> dict[str, str]:
    """MoE preset name -> description."""
    return {p.stem: json.loads(p.read_text()).get("description", "")
            for p in sorted(_presets_dir().glob("*.json"))}


def is_moe_config(data: dict) -> bool:
    """A Hugging Face config (or a MoeSpec JSON) that describes routed experts."""
    if "experts" in data and "hidden" in data:
        return True
    return any(isinstance(data.get(k), int) and not isinstance(data.get(k), bool) and data[k] > 1
               for k in MOE_KEYS)


def is_moe_model(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names a MoE preset, or a readable JSON file (or folder
    with a ``config.json``) that describes routed experts (:func:`is_moe_config`)."""
    path = Path(name_or_path)
    if not path.exists():
        return not looks_like_path(name_or_path) and name_or_path in list_moe_models()
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError, UnicodeDecodeError):
        return False
    if isinstance(data, dict) and "text_config" in data and "hidden_size" not in data:
        data = data["text_config"]
    return isinstance(data, dict) and is_moe_config(data)


def load_moe_model(name_or_path: str, **overrides: Any) -> MoeSpec:
    """A MoE preset by name, a MoeSpec JSON file, or a Hugging Face MoE ``config.json``
    (file or folder); ModelError (one line) otherwise."""
    path = Path(name_or_path)
    if not path.exists():
        if looks_like_path(name_or_path):
            raise ModelError(f"model: file not found: {name_or_path}")
        path = _presets_dir() / f"{name_or_path}.json"
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ModelError(f"model: unknown MoE model '{name_or_path}'; valid: {', '.join(list_moe_models())} "
                         "(or a MoE model JSON or Hugging Face config.json file)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: cannot read it as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a JSON object")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if "hidden" not in data:
        data = from_hf_moe_config(data, name=overrides.pop("name", None) or path.parent.name or path.stem,
                                  where=str(path)).model_dump()
    data.update(overrides)
    try:
        return MoeSpec.model_validate(data)
    except ValidationError as exc:
        raise _one_line(exc, path.name) from None


def from_hf_moe_config(cfg: dict, name: str = "hf-moe", where: str = "hf config", seq: int = 4096,
                       batch: int = 1) -> MoeSpec:
    """A MoeSpec from a Hugging Face MoE ``config.json`` dict. Field names:

    * Mixtral: ``num_local_experts``, ``num_experts_per_tok``, ``intermediate_size`` (the
      expert's FFN);
    * Qwen2-MoE / Qwen3-MoE: ``num_experts``, ``num_experts_per_tok``,
      ``moe_intermediate_size``, ``intermediate_size`` (dense), Qwen2-MoE's
      ``shared_expert_intermediate_size`` (counted as whole shared experts of the expert
      width, rounded up);
    * DeepSeek-V2/V3: ``n_routed_experts``, ``num_experts_per_tok``,
      ``moe_intermediate_size``, ``n_shared_experts``, ``n_group``, ``topk_group``,
      ``first_k_dense_replace``, ``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
      ``qk_rope_head_dim``, ``v_head_dim`` (MLA: timed as MHA of ``qk_nope_head_dim +
      qk_rope_head_dim`` by default, as itself under ``moe.mla_timing`` = ``mla``; counted
      as itself by the footprint: module doc); a
      ``quantization_config`` of ``quant_method`` ``fp8`` sets ``weight_dtype_bytes`` 1.
    """
    if "text_config" in cfg and "hidden_size" not in cfg and isinstance(cfg["text_config"], dict):
        cfg = cfg["text_config"]

    def get(*keys: str, default: Any = KeyError) -> Any:
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        if default is KeyError:
            raise ModelError(f"{where}: missing key '{keys[0]}'"
                             + (f" (or {', '.join(repr(k) for k in keys[1:])})" if keys[1:] else ""))
        return default

    experts = get("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
    family = str(cfg.get("model_type") or "hf-moe")
    mla = "kv_lora_rank" in cfg and cfg.get("kv_lora_rank") is not None
    dense_ffn = get("intermediate_size")
    expert_ffn = get("moe_intermediate_size", default=None) or dense_ffn
    shared = get("n_shared_experts", default=None)
    if shared is None:
        width = get("shared_expert_intermediate_size", default=0) or 0
        shared = -(-width // expert_ffn) if width else 0
    head_dim = get("head_dim", default=None)
    mla_dims: dict[str, Any] = {}
    if mla:
        nope, rope = get("qk_nope_head_dim", default=128), get("qk_rope_head_dim", default=64)
        head_dim = nope + rope
        mla_dims = dict(q_lora_rank=get("q_lora_rank", default=None), kv_lora_rank=get("kv_lora_rank"),
                        qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=get("v_head_dim", default=nope))
    quant = cfg.get("quantization_config")
    fp8 = isinstance(quant, dict) and str(quant.get("quant_method", "")).lower() == "fp8"
    data = dict(
        name=name, family=family,
        description=f"Imported from Hugging Face config ({family})"
        + ("; MLA approximated as MHA of its score width (docs/moe.md)" if mla else ""),
        hidden=get("hidden_size"), heads=get("num_attention_heads"),
        kv_heads=get("num_attention_heads") if mla else get("num_key_value_heads", default=None),
        head_dim=head_dim, layers=get("num_hidden_layers"), vocab=get("vocab_size", default=None),
        dense_ffn_hidden=dense_ffn, experts=experts, topk=get("num_experts_per_tok", "moe_k", "moe_topk"),
        expert_ffn_hidden=expert_ffn, shared_experts=shared,
        n_group=get("n_group", default=1) or 1, topk_group=get("topk_group", default=1) or 1,
        dense_layers=get("first_k_dense_replace", default=0) or 0,
        attention="mla" if mla else "gqa", **mla_dims, seq=seq, batch=batch,
        weight_dtype_bytes=1 if fp8 else 2,
    )
    try:
        return MoeSpec.model_validate(data)
    except ValidationError as exc:
        raise _one_line(exc, where) from None


__all__ = ["MLA_FIELDS", "EpPlan", "MoeSpec", "from_hf_moe_config", "is_moe_config", "is_moe_model", "list_moe_models",
           "load_moe_model"]
