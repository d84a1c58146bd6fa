"""The per-GPU sizes of one period of a tensor-parallel layer (``Dims``) and the run
modes a period can be built for."""

from __future__ import annotations

from dataclasses import dataclass

from cais.workload.models import ModelSpec

MODES = ("train", "prefill", "decode")


@dataclass(frozen=True)
class Dims:
    """Per-GPU shapes of one period for TP degree ``n``."""

    n: int
    tokens: int  # rows of the activations (tokens; in decode, one per sequence)
    batch: int
    seq: int  # query positions per sequence (1 in decode)
    kv_len: int  # keys per sequence (the KV cache length in decode)
    hidden: int
    heads_l: int
    kv_l: int
    head_dim: int
    ffn_l: int
    gated: bool
    sp: bool

    @property
    def rows_l(self) -> int:
        """Rows of the row-wise ops on one GPU: a token shard with SP, all without."""
        return self.tokens // self.n if self.sp else self.tokens

    @property
    def q_l(self) -> int:
        return self.heads_l * self.head_dim

    @property
    def qkv_l(self) -> int:
        return (self.heads_l + 2 * self.kv_l) * self.head_dim

    @property
    def fc1_l(self) -> int:
        return 2 * self.ffn_l if self.gated else self.ffn_l


def dims_for(model: ModelSpec, n: int, mode: str, sp: bool, kv_len: int | None = None) -> Dims:
    model.check_tp(n)
    kv_l = model.kv // n if model.kv >= n else 1
    if mode == "decode":
        tokens, seq, kvl = model.batch, 1, kv_len or model.seq
    else:
        tokens, seq, kvl = model.tokens, model.seq, model.seq
    if sp and tokens % n:
        raise ValueError(f"--mode {mode}: {tokens} token rows do not split over {n} GPUs; use a batch that does")
    return Dims(n, tokens, model.batch, seq, kvl, model.hidden, model.heads // n, kv_l, model.dim,
                model.ffn_hidden // n, model.gated_mlp, sp)
