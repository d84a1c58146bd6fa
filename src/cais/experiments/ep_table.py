"""What ``st.mc.dyn``'s dynamic multicast group table needs, per routing (docs/moe.md,
"In-switch expert parallelism"; its cost: :mod:`cais.cost.group_table`).

A sender port needs one entry per distinct set of remote destination ranks (two or
more: one rank needs no group) among the tokens whose groups are bound at once: the
whole call (entries live for the call) or one block of the fused pipeline (entries live
for a block; two blocks' worth while one drains and the next binds, so the need is the
largest sum of two consecutive blocks). Counted per routing seed; the need reported is
the 99th percentile over seeds of the busiest port's entries, times the entry's bytes
(hw/ep_switch.py: ``entry_bytes``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cais.hw.ep_switch import entry_bytes
from cais.workload.routing import Routing, generate

#: the lifetimes an entry may have
LIFETIMES = ("call", "block")
#: CAIS's merge table per port (``switch.merge``'s default 320 lines of 128 B), the budget the need is set against
CAIS_TABLE_BYTES = 320 * 128


def groups_per_port(rt: Routing, block_tokens: int | None = None) -> np.ndarray:
    """Entries each sender port holds at once: distinct remote destination sets of two
    or more ranks in the call (``block_tokens`` None), else the most in two consecutive
    blocks of ``block_tokens`` tokens."""
    hit = rt.in_rank()  # [sender, token, rank]
    n, T = rt.ranks, rt.tokens
    out = np.zeros(n, dtype=np.int64)
    for g in range(n):
        h = hit[g].copy()
        h[:, g] = False
        keep = np.nonzero(h.sum(axis=1) >= 2)[0]
        if not len(keep):
            continue
        packed = np.ascontiguousarray(np.packbits(h[keep], axis=1))
        keys = packed.view(np.dtype((np.void, packed.shape[1]))).reshape(-1)
        _, ids = np.unique(keys, return_inverse=True)
        if block_tokens is None:
            out[g] = int(ids.max()) + 1
            continue
        blocks = -(-T // block_tokens)
        pairs = np.unique(keep // block_tokens * (int(ids.max()) + 1) + ids.reshape(-1))
        per_block = np.bincount(pairs // (int(ids.max()) + 1), minlength=blocks)
        two = per_block[:-1] + per_block[1:] if blocks > 1 else per_block
        out[g] = int(two.max())
    return out


def table_need(kind: str, ranks: int, tokens: int, experts: int, topk: int, seeds: int = 100,
               block_tokens: int = 1, alpha: float = 1.2, sigma: float = 1.0, q: float = 99.0,
               n_group: int = 1, topk_group: int = 1, lifetimes: tuple[str, ...] = LIFETIMES) -> list[dict[str, Any]]:
    """For each of ``lifetimes`` (the call; blocks of ``block_tokens``), the busiest port's
    entries at the ``q``-th percentile over ``seeds`` routings (group-limited as
    ``n_group``, ``topk_group`` say: DeepSeek-V3's 8 and 4), and their bytes against
    CAIS's 40 KB."""
    peaks: dict[str, list[int]] = {life: [] for life in LIFETIMES if life in lifetimes}
    for seed in range(seeds):
        rt = generate(kind, ranks, tokens, experts, topk, seed, alpha, sigma, n_group, topk_group)
        for life, got in peaks.items():
            got.append(int(groups_per_port(rt, None if life == "call" else block_tokens).max()))
    out = []
    for life, got in peaks.items():
        entries = int(math.ceil(np.percentile(got, q)))
        nbytes = entries * entry_bytes(ranks)
        out.append({"routing": kind, "ranks": ranks, "tokens": tokens, "lifetime": life, "entries_p99": entries,
                    "entry_bytes": entry_bytes(ranks), "bytes_p99": nbytes, "of_cais_40KB": nbytes / CAIS_TABLE_BYTES,
                    "max_entries": max(got), "seeds": seeds})
    return out
