"""The model zoo: the shape of one transformer layer of a model plus its default run shape.

Presets live as JSON files in ``cais/data/models/`` (:func:`list_models` lists them); a
user can also pass a path to their own JSON file or to a Hugging Face ``config.json``
(:func:`from_hf_config`, no network). See docs/models.md.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cais.errors import UserError, looks_like_path, validation_message


class ModelError(UserError):
    """A user-facing model mistake; its message is one line."""


class AttentionShape:
    """The attention's head layout, shared by dense and MoE models: the effective KV
    heads (grouped-query attention where fewer than the query heads) and head width,
    from ``heads``, ``kv_heads``, ``head_dim`` and ``hidden``."""

    heads: int
    kv_heads: int | None
    head_dim: int | None
    hidden: int

    @property
    def kv(self) -> int:
        """Effective number of KV heads."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def dim(self) -> int:
        """Effective head dimension."""
        return self.hidden // self.heads if self.head_dim is None else self.head_dim


class ModelSpec(AttentionShape, BaseModel):
    """The shape of one transformer layer of a model plus its default run shape
    (sequence length and batch size of one step).

    ``gated_mlp`` means SwiGLU: FC1 is two GEMMs (gate and up) of width ``ffn_hidden``
    each and the activation is ``silu(gate) * up``; FC2 maps ``ffn_hidden`` back to
    ``hidden``. ``kv_heads`` None means MHA (= heads); ``head_dim`` None means
    ``hidden // heads`` (``q_width`` may then differ from ``hidden``, as Megatron's
    ``kv_channels`` allows).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    family: str = Field(description="gpt, llama, paper, ...")
    hidden: int = Field(gt=0)
    ffn_hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int | None = Field(None, gt=0, description="None: = heads (MHA)")
    head_dim: int | None = Field(None, gt=0, description="None: hidden // heads")
    layers: int = Field(gt=0)
    gated_mlp: bool
    norm: Literal["layernorm", "rmsnorm"]
    activation: Literal["gelu", "swiglu"]
    seq: int = Field(gt=0)
    batch: int = Field(gt=0)
    dtype_bytes: int = Field(2, gt=0)
    vocab: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.heads % self.kv:
            raise ValueError(f"kv_heads ({self.kv}) must divide heads ({self.heads})")
        if self.head_dim is None and self.hidden < self.heads:
            raise ValueError(f"head_dim: hidden // heads is 0 (hidden {self.hidden}, heads {self.heads})")
        if self.gated_mlp != (self.activation == "swiglu"):
            raise ValueError("gated_mlp must be true exactly when activation is 'swiglu'")
        return self

    @property
    def q_width(self) -> int:
        return self.heads * self.dim

    @property
    def kv_width(self) -> int:
        return self.kv * self.dim

    @property
    def tokens(self) -> int:
        return self.seq * self.batch

    @property
    def params_per_layer(self) -> int:
        """Attention (Q, K, V, O) plus MLP weights; no norms, no biases."""
        h = self.hidden
        attn = h * (self.q_width + 2 * self.kv_width) + self.q_width * h
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn_hidden
        return attn + mlp

    def check_tp(self, n: int) -> str:
        """Raise ModelError (one line) if the layer cannot be split over ``n`` TP ranks.

        KV heads fewer than ``n`` are allowed when ``n % kv_heads == 0``: each KV head is
        then replicated on ``n // kv_heads`` ranks; the returned note says so ("" if no
        note). The token rows need not divide: sequence-parallel runs pad them
        (``cais.workload.dims``)."""
        if n <= 0:
            raise ModelError(f"{self.name}: TP degree must be positive, got {n}")
        bad = self._tp_misfit(n)
        if bad:
            allowed = ", ".join(str(k) for k in self.tp_degrees())
            raise ModelError(f"{self.name}: TP={n} does not divide {', '.join(bad)}; the TP degrees it allows: "
                             f"{allowed}")
        if self.kv < n:
            return f"{self.name}: {self.kv} KV heads over TP={n}: each KV head replicated on {n // self.kv} ranks"
        return ""

    def tp_degrees(self) -> list[int]:
        """Every TP degree the layer splits over (the divisors of ``heads`` that
        also fit ``kv_heads`` and ``ffn_hidden``)."""
        return [k for k in range(1, self.heads + 1) if not self._tp_misfit(k)]

    def _tp_misfit(self, n: int) -> list[str]:
        """The dimensions ``n`` ranks cannot split (empty: it fits)."""
        bad = []
        if self.heads % n:
            bad.append(f"heads {self.heads}")
        if self.kv < n:
            if n % self.kv:
                bad.append(f"kv_heads {self.kv} (fewer than {n} and not a divisor of it)")
        elif self.kv % n:
            bad.append(f"kv_heads {self.kv}")
        if self.ffn_hidden % n:
            bad.append(f"ffn_hidden {self.ffn_hidden}")
        return bad

    def with_run(self, batch: int | None = None, seq: int | None = None) -> "ModelSpec":
        """A copy with a different run shape (validated again)."""
        data = self.model_dump()
        if batch is not None:
            data["batch"] = batch
        if seq is not None:
            data["seq"] = seq
        try:
            return ModelSpec.model_validate(data)
        except ValidationError as exc:
            raise _one_line(exc, f"{self.name} with batch={batch}, seq={seq}") from None


# ---------------------------------------------------------------------------------------
# Loading

def _presets_dir() -> Path:
    return Path(str(resources.files("cais") / "data" / "models"))


def list_models() -> dict[str, str]:
    """Preset name -> description."""
    return {p.stem: json.loads(p.read_text()).get("description", "")
            for p in sorted(_presets_dir().glob("*.json"))}


def _one_line(exc: ValidationError, where: str) -> ModelError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = validation_message(err)  # cross-field checks name their fields
    return ModelError(f"{where}: field '{loc}': {msg}" if loc else f"{where}: {msg}")


def _is_hf(data: dict) -> bool:
    return "hidden" not in data and any(
        k in data for k in ("hidden_size", "n_embd", "text_config", "model_type", "d_model"))


def load_model(name_or_path: str, **overrides: Any) -> ModelSpec:
    """Load a preset by name (``llama3-70b``), a ModelSpec JSON file, or a Hugging Face
    ``config.json`` (file or the folder holding it). ``overrides`` replace fields (None
    values are ignored). Raises ModelError with a one-line message."""
    path = Path(name_or_path)
    if not path.exists():
        if looks_like_path(name_or_path):
            raise ModelError(f"model: file not found: {name_or_path}")
        path = _presets_dir() / f"{name_or_path}.json"
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ModelError(f"model: {name_or_path} is a directory without a config.json")
    if not path.is_file():
        raise ModelError(f"model: unknown model '{name_or_path}'; valid: {', '.join(list_models())} "
                         "(or a model JSON or Hugging Face config.json file)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: cannot read it ({getattr(exc, 'strerror', None) or 'not UTF-8 text'})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a JSON object (a model or a Hugging Face config.json)")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if _is_hf(data):
        spec = from_hf_config(data, name=overrides.pop("name", None) or _hf_name(data, path), where=str(path))
        data = spec.model_dump()
    data.update(overrides)
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise _one_line(exc, path.name) from None


# ---------------------------------------------------------------------------------------
# Hugging Face config.json import

_GATED_ACTS = {"silu", "swish"}


def _hf_name(cfg: dict, path: Path | None) -> str:
    if cfg.get("_name_or_path"):
        return str(cfg["_name_or_path"]).rstrip("/").split("/")[-1]
    if path is not None and path.name == "config.json" and path.parent.name:
        return path.parent.name
    if path is not None:
        return path.stem
    return str(cfg.get("model_type", "hf-model"))


# Keys that give a mixture-of-experts model's expert count: Mixtral (``num_local_experts``),
# DeepSeek-V2/V3 (``n_routed_experts``), Qwen-MoE, OLMoE and Jamba (``num_experts``),
# ERNIE-MoE (``moe_num_experts``). A value above 1 means routed experts, not a dense MLP.
MOE_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")


def _refuse_moe(cfg: dict, where: str) -> None:
    """ModelError (one line, naming the key) for a mixture-of-experts config: its MLP is
    routed experts, and importing it as one dense MLP would be a silent wrong answer."""
    for key in MOE_KEYS:
        value = cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1:
            per_token = cfg.get("num_experts_per_tok", cfg.get("moe_k"))
            routed = f", {per_token} per token" if isinstance(per_token, int) else ""
            raise ModelError(f"{where}: field '{key}': {value:g} experts{routed}: a mixture-of-experts (MoE) model, "
                             "which cais-sim does not model; it models dense decoder layers (attention and one "
                             f"dense MLP per layer), so '{key}' must be absent or 1")


def from_hf_config(path_or_dict: str | Path | dict, name: str | None = None,
                   seq: int = 2048, batch: int = 1, where: str | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` (path, folder or dict).

    Supports LLaMA/Mistral/Qwen-style keys (``hidden_size``, ``intermediate_size``,
    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``; ``hidden_act`` silu
    => SwiGLU + RMSNorm), GPT-2 (``n_embd``, ``n_head``, ``n_layer``, ``n_inner`` default
    4*n_embd; GELU + LayerNorm) and GPT-NeoX/OPT (``intermediate_size`` / ``ffn_dim``).
    Non-gated activations other than GELU (e.g. OPT's relu) are modelled as ``gelu``
    (same cost). ``max_position_embeddings`` is not used: ``seq`` is the run shape.
    ``where`` names the config in error messages (default: its path, or "hf config").
    A mixture-of-experts config (:data:`MOE_KEYS` above 1) is refused: only dense
    decoder layers are modelled.
    """
    path: Path | None = None
    if isinstance(path_or_dict, dict):
        cfg = path_or_dict
        where = where or "hf config"
    else:
        path = Path(path_or_dict)
        if path.is_dir():
            path = path / "config.json"
        where = str(path)
        try:
            cfg = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelError(f"{where}: no such file") from None
        except json.JSONDecodeError as exc:
            raise ModelError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if "text_config" in cfg and "hidden_size" not in cfg and isinstance(cfg["text_config"], dict):
        cfg = {**cfg["text_config"], "_name_or_path": cfg.get("_name_or_path", "")}
    _refuse_moe(cfg, where)

    def get(*keys: str, default: Any = KeyError) -> Any:
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        if default is KeyError:
            raise ModelError(f"{where}: missing key '{keys[0]}'"
                             + (f" (or {', '.join(repr(k) for k in keys[1:])})" if keys[1:] else ""))
        return default

    gpt2 = "n_embd" in cfg
    hidden = get("n_embd") if gpt2 else get("hidden_size", "d_model")
    heads = get("n_head") if gpt2 else get("num_attention_heads", "n_head")
    layers = get("n_layer") if gpt2 else get("num_hidden_layers", "n_layer", "num_layers")
    if gpt2:
        ffn = get("n_inner", default=None) or 4 * hidden
    else:
        ffn = get("intermediate_size", "ffn_dim", "n_inner")
    act = str(get("hidden_act", "activation_function", "hidden_activation", default="gelu")).lower()
    gated = act in _GATED_ACTS
    rms = gated or "rms_norm_eps" in cfg
    family = str(cfg.get("model_type") or ("gpt2" if gpt2 else "hf"))
    desc = f"Imported from Hugging Face config ({family})"
    if not gated and not act.startswith("gelu"):
        desc += f"; activation {act} modelled as gelu (same non-gated cost)"
    data = dict(
        name=name or _hf_name(cfg, path), description=desc, family=family,
        hidden=hidden, ffn_hidden=ffn, heads=heads,
        kv_heads=get("num_key_value_heads", "num_kv_heads", default=None),
        head_dim=get("head_dim", default=None), layers=layers, gated_mlp=gated,
        norm="rmsnorm" if rms else "layernorm", activation="swiglu" if gated else "gelu",
        seq=seq, batch=batch, vocab=get("vocab_size", default=None),
    )
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise _one_line(exc, where) from None
