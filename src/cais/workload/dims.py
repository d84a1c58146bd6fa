"""The per-GPU sizes of one period of a tensor-parallel layer (``Dims``) and the run
modes a period can be built for."""

from __future__ import annotations

from dataclasses import dataclass

from cais.workload.models import ModelSpec

MODES = ("train", "prefill", "decode")


@dataclass(frozen=True)
class Dims:
    """Per-GPU shapes of one period for TP degree ``n``.

    ``tokens`` is the row count of the activations between the GEMMs. With sequence
    parallelism it is the real token count padded up to a multiple of ``n`` (as
    Megatron / vLLM pad the token dimension for the ReduceScatter / AllGather):
    ``pad`` zero rows are appended after the real ones, moved by the collectives and
    processed by the row-wise kernels and GEMMs like real rows, and dropped after.
    Attention runs on the real sequences only (``batch`` x ``seq``)."""

    n: int
    tokens: int  # rows of the activations (tokens, one per sequence in decode), padded with SP
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
    pad: int = 0  # zero rows appended to the real tokens so that they split over n (SP only)

    @property
    def real_tokens(self) -> int:
        """Token rows that carry real tokens (``batch * seq``); the rest is padding."""
        return self.tokens - self.pad

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
    """The per-GPU sizes of ``model``'s period on ``n`` GPUs in ``mode``; with ``sp``
    the token rows (``batch`` in decode, ``batch * seq`` otherwise) are padded up to a
    multiple of ``n`` (``Dims.pad``), in every mode."""
    model.check_tp(n)
    kv_l = model.kv // n if model.kv >= n else 1
    if mode == "decode":
        tokens, seq, kvl = model.batch, 1, kv_len or model.seq
    else:
        tokens, seq, kvl = model.tokens, model.seq, model.seq
    pad = -tokens % n if sp else 0  # SP: pad the token rows up to a multiple of n
    return Dims(n, tokens + pad, model.batch, seq, kvl, model.hidden, model.heads // n, kv_l, model.dim,
                model.ffn_hidden // n, model.gated_mlp, sp, pad)
