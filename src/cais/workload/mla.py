"""Multi-head latent attention (MLA, DeepSeek-V2/V3) as one GPU runs it: the per-GPU
widths of its projections, its latent KV cache and its attention, from a MoE model's
recorded shape (:class:`~cais.workload.moe.MoeSpec`: ``q_lora_rank``, ``kv_lora_rank``,
``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``) and the heads one GPU of an
attention TP group holds.

As SGLang runs DeepSeek (sgl-project/sglang@00114aef, ``python/sglang/srt/models/
deepseek_v2.py``, ``DeepseekV2AttentionMLA``): ``fused_qkv_a_proj_with_mqa`` is a
``ReplicatedLinear`` [hidden, q_lora + kv_lora + rope] (every GPU of a TP group computes
it on the group's rows), ``q_a_layernorm`` and ``kv_a_layernorm`` are RMSNorms of the two
latents, ``q_b_proj`` [q_lora, heads x (nope + rope)] and ``kv_b_proj`` [kv_lora, heads x
(nope + v)] are column parallel and ``o_proj`` [heads x v, hidden] row parallel. Prefill
(``forward_normal_prepare``) expands the latent through ``kv_b_proj`` and runs MHA with
score width nope + rope and value width v; decode (``forward_absorb_prepare`` /
``forward_absorb_core``) multiplies each head's ``q_nope`` by ``w_kc`` (W_UK, per head
[nope, kv_lora]), runs MQA over the latent cache (one "KV head" of kv_lora + rope, value
width kv_lora) and multiplies its output by ``w_vc`` (W_UV, per head [kv_lora, v]) before
``o_proj``. Without a ``q_lora_rank`` (DeepSeek-V2-Lite) the query is ``q_proj`` [hidden,
heads x (nope + rope)], column parallel, and the replicated projection is
``kv_a_proj_with_mqa`` [hidden, kv_lora + rope] alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from cais.workload.moe import MoeSpec


@dataclass(frozen=True)
class MlaDims:
    """One GPU's MLA widths: ``heads_l`` local heads; ``q_lora`` the query latent (0:
    none, a full ``q_proj``), ``kv_lora`` the KV latent, ``nope`` and ``rope`` a head's
    query/key widths without and with RoPE (the RoPE key is shared by every head), ``v``
    a head's value width."""

    heads_l: int
    q_lora: int
    kv_lora: int
    nope: int
    rope: int
    v: int

    @property
    def qk(self) -> int:
        """A head's score width (nope + rope: 192 in DeepSeek-V3)."""
        return self.nope + self.rope

    @property
    def latent(self) -> int:
        """One token's latent cache entry: the KV latent and the shared RoPE key (576)."""
        return self.kv_lora + self.rope

    @property
    def qkv_a(self) -> int:
        """The replicated input projection's output width: q_lora + kv_lora + rope."""
        return self.q_lora + self.latent

    @property
    def q_width(self) -> int:
        """The local query's width: heads_l x (nope + rope)."""
        return self.heads_l * self.qk

    @property
    def kv_b(self) -> int:
        """The local expanded K (no RoPE) and V's width: heads_l x (nope + v)."""
        return self.heads_l * (self.nope + self.v)

    @property
    def out(self) -> int:
        """The attention output the output projection reads: heads_l x v."""
        return self.heads_l * self.v

    @property
    def q_latent(self) -> int:
        """The absorbed query's width in decode: heads_l x (kv_lora + rope)."""
        return self.heads_l * self.latent

    @property
    def o_latent(self) -> int:
        """The absorbed attention's output width in decode: heads_l x kv_lora."""
        return self.heads_l * self.kv_lora


def mla_dims(moe: MoeSpec, heads_l: int) -> MlaDims | None:
    """``moe``'s MLA widths on a GPU holding ``heads_l`` of its heads; None for a model
    whose attention is not MLA."""
    if moe.attention != "mla":
        return None
    widths = (moe.kv_lora_rank, moe.qk_nope_head_dim, moe.qk_rope_head_dim, moe.v_head_dim)
    if any(w is None for w in widths):  # MoeSpec's validator refuses this; a bug if it got here
        raise ValueError(f"{moe.name}: attention 'mla' without its widths")
    kv_lora, nope, rope, v = (int(w) for w in widths)  # type: ignore[arg-type]
    return MlaDims(heads_l, moe.q_lora_rank or 0, kv_lora, nope, rope, v)
