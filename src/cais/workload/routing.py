"""Token-to-expert routing for expert parallelism: seeded generators, a capacity
factor, and what the routing asks of the fabric (per-rank send/receive matrices and
their imbalance).

A :class:`Routing` holds, for every EP rank ``g`` and each of its ``tokens`` tokens,
the ``topk`` global expert ids it is sent to (-1: dropped) and their gate weights.
Expert ``e`` lives on rank ``e // (experts / ranks)`` (DeepEP's and Megatron's
contiguous placement).

Generators (all seeded; :data:`GENERATORS`):

* ``uniform``: as DeepEP's tests draw it (tests/legacy/test_intranode.py at
  deepseek-ai/DeepEP@dd758caf): scores ``|randn| + 1`` per (token, expert), the top-k;
  with group-limited routing the ``topk_group`` groups of highest max score first;
* ``powerlaw``: expert popularity ``p_e ~ (r_e + 1) ** -alpha`` for a random rank
  order ``r`` of the experts; each token draws ``topk`` distinct experts with
  probability proportional to it (Gumbel top-k);
* ``lognormal``: popularity ``exp(sigma * randn)``, drawn alike;
* ``balanced``: no draw: token ``t``'s ``j``-th expert is ``(t + j) mod experts``, so
  every rank sends every expert the same rows when ``experts`` divides ``tokens``
  (with top-1 and one expert per rank, nccl-tests' ``alltoall``: equal shares);
* ``trace``: a routing trace file (JSON ``{"topk_idx": [[...], ...]}``, a token's
  experts a row, tokens of rank 0 first; or a ``.npy`` array ``[tokens, topk]``).

A capacity factor ``cf`` (Megatron-Core's ``moe_expert_capacity_factor``) bounds what
one rank sends one expert to ``ceil(cf * tokens * topk / experts)`` rows; ``drop``
drops the rest in token order (Megatron's ``position`` drop policy), ``pad`` also
fills every (rank, expert) up to capacity with padding rows, which move like real ones.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cais.errors import UserError

GENERATORS = ("uniform", "powerlaw", "lognormal", "balanced", "trace")
CAPACITY_MODES = ("none", "drop", "pad")


@dataclass(frozen=True)
class Routing:
    """Every rank's tokens' experts (``topk_idx`` [ranks, tokens, topk], -1 dropped)
    and gate weights (``weights``, same shape) over ``experts`` experts;
    ``pad_rows[g, e]``: padding rows rank ``g`` sends expert ``e`` (capacity ``pad``)."""

    topk_idx: np.ndarray
    weights: np.ndarray
    experts: int
    pad_rows: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    source: str = "uniform"

    @property
    def ranks(self) -> int:
        return int(self.topk_idx.shape[0])

    @property
    def tokens(self) -> int:
        return int(self.topk_idx.shape[1])

    @property
    def topk(self) -> int:
        return int(self.topk_idx.shape[2])

    @property
    def per_rank(self) -> int:
        return self.experts // self.ranks

    def owner(self, expert: np.ndarray | int) -> np.ndarray | int:
        """The rank that holds ``expert``."""
        return expert // self.per_rank

    def in_rank(self) -> np.ndarray:
        """[ranks, tokens, ranks] bool: token t of rank g goes to rank r (DeepEP's
        ``is_token_in_rank``: one copy per (token, destination rank))."""
        hit = np.zeros((self.ranks, self.tokens, self.ranks), dtype=bool)
        g, t, k = np.nonzero(self.topk_idx >= 0)
        hit[g, t, self.topk_idx[g, t, k] // self.per_rank] = True
        return hit

    def expert_rows(self) -> np.ndarray:
        """[ranks, experts]: rows rank g sends expert e (one per (token, expert)), padding included."""
        rows = np.zeros((self.ranks, self.experts), dtype=np.int64)
        for g in range(self.ranks):
            idx = self.topk_idx[g][self.topk_idx[g] >= 0]
            rows[g] += np.bincount(idx, minlength=self.experts)
        if self.pad_rows.size:
            rows += self.pad_rows
        return rows

    def matrix(self, per: str = "rank") -> np.ndarray:
        """[ranks, ranks] rows sent from rank g (row) to rank r (column): ``per`` "rank"
        counts one copy per (token, destination rank) (DeepEP normal), "expert" one per
        (token, expert) (DeepEP low-latency, NCCL all-to-all after Megatron's permute)."""
        if per == "rank":
            return self.in_rank().sum(axis=1).astype(np.int64)
        if per == "expert":
            return self.expert_rows().reshape(self.ranks, self.ranks, self.per_rank).sum(axis=2)
        raise UserError(f"per: unknown '{per}'; valid: rank, expert")

    def dropped(self) -> int:
        return int((self.topk_idx < 0).sum())


def imbalance(matrix: np.ndarray) -> float:
    """The busiest endpoint over the mean: the largest of the send (row) and receive
    (column) totals over their mean (1.0: balanced; 0 rows: 1.0)."""
    sends, recvs = matrix.sum(axis=1), matrix.sum(axis=0)
    mean = float(sends.mean())
    if mean == 0:
        return 1.0
    return float(max(sends.max(), recvs.max())) / mean


def _group_mask(scores: np.ndarray, n_group: int, topk_group: int) -> np.ndarray:
    """Scores with experts outside each token's ``topk_group`` best groups (by their
    best expert) set to -inf."""
    t, e = scores.shape
    groups = scores.reshape(t, n_group, e // n_group).max(axis=2)
    keep = np.argsort(-groups, axis=1, kind="stable")[:, :topk_group]
    mask = np.zeros((t, n_group), dtype=bool)
    np.put_along_axis(mask, keep, True, axis=1)
    return np.where(np.repeat(mask, e // n_group, axis=1), scores, -np.inf)


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Each row's ``k`` highest scores' columns, highest first, ties to the lower column:
    exactly the first ``k`` of a stable descending argsort, without sorting the rest.
    A partition picks each row's ``k`` best; a row where a score equal to its ``k``-th
    best lies outside the pick (a tie across the cut, which the partition breaks
    arbitrarily) is sorted whole instead."""
    rows, cols = scores.shape
    if k >= cols:
        return np.argsort(-scores, axis=1, kind="stable")[:, :k]
    neg = -scores
    pick = np.argpartition(neg, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(neg, pick, axis=1)
    kth = vals.max(axis=1, keepdims=True)
    out = np.take_along_axis(pick, np.lexsort((pick, vals), axis=-1), axis=1)
    cut = np.nonzero((neg == kth).sum(axis=1) > (vals == kth).sum(axis=1))[0]
    if cut.size:
        out[cut] = np.argsort(neg[cut], axis=1, kind="stable")[:, :k]
    return out


def generate(kind: str, ranks: int, tokens: int, experts: int, topk: int, seed: int = 0, alpha: float = 1.0,
             sigma: float = 1.0, n_group: int = 1, topk_group: int = 1, trace: str | None = None,
             capacity_factor: float | None = None, capacity: str = "none", ep: int | None = None) -> Routing:
    """A seeded routing of ``tokens`` tokens on each of ``ranks`` ranks (module doc);
    UserError (one line, naming the field) on bad input. ``ep``: the ranks the experts
    split over when fewer than ``ranks`` (expert TP: :func:`expert_tp_routing` maps the
    draw onto the GPUs; the draw does not depend on it)."""
    if kind not in GENERATORS:
        raise UserError(f"routing: unknown '{kind}'; valid: {', '.join(GENERATORS)}")
    if capacity not in CAPACITY_MODES:
        raise UserError(f"capacity: unknown '{capacity}'; valid: {', '.join(CAPACITY_MODES)}")
    for name, value in (("ranks", ranks), ("tokens", tokens), ("experts", experts), ("topk", topk)):
        if value <= 0:
            raise UserError(f"{name}: must be positive, got {value}")
    if experts % (ep or ranks):
        owners = ep or ranks
        raise UserError(f"experts: {experts} experts do not split over {owners} ranks (must be a multiple of {owners})")
    if topk > experts:
        raise UserError(f"topk: {topk} exceeds experts ({experts})")
    if n_group <= 0 or experts % n_group or not 0 < topk_group <= n_group:
        raise UserError(f"n_group: {n_group} groups with topk_group {topk_group} do not fit {experts} experts")
    rng = np.random.default_rng(seed)
    if kind == "trace":
        idx = _read_trace(trace, ranks, tokens, experts, topk)
    elif kind == "balanced":
        slots = np.arange(tokens)[:, None] + np.arange(topk)[None, :]
        idx = np.broadcast_to(slots % experts, (ranks, tokens, topk)).astype(np.int64)
    elif kind == "uniform":
        idx = np.empty((ranks, tokens, topk), dtype=np.int64)
        for g in range(ranks):
            scores = np.abs(rng.standard_normal((tokens, experts))) + 1
            if n_group > 1:
                scores = _group_mask(scores, n_group, topk_group)
            idx[g] = _topk(scores, topk)
    else:
        if kind == "powerlaw":
            if alpha < 0:
                raise UserError(f"alpha: must be at least 0, got {alpha}")
            pop = (rng.permutation(experts) + 1.0) ** -alpha
        else:
            if sigma < 0:
                raise UserError(f"sigma: must be at least 0, got {sigma}")
            pop = np.exp(sigma * rng.standard_normal(experts))
        logp = np.log(pop / pop.sum())
        idx = np.empty((ranks, tokens, topk), dtype=np.int64)
        for g in range(ranks):
            keys = logp + rng.gumbel(size=(tokens, experts))
            if n_group > 1:
                keys = _group_mask(keys, n_group, topk_group)
            idx[g] = _topk(keys, topk)
    weights = rng.random((ranks, tokens, topk)) + 0.5
    weights /= weights.sum(axis=2, keepdims=True)
    pad = np.zeros((ranks, experts), dtype=np.int64)
    if capacity_factor is not None or capacity != "none":
        if capacity_factor is None or capacity_factor <= 0:
            raise UserError(f"capacity_factor: must be positive with capacity '{capacity}', got {capacity_factor}")
        cap = math.ceil(capacity_factor * tokens * topk / experts)
        idx = idx.copy()
        for g in range(ranks):
            seen = np.zeros(experts, dtype=np.int64)
            for t in range(tokens):
                for k in range(topk):
                    e = idx[g, t, k]
                    if e < 0:
                        continue
                    if seen[e] >= cap:
                        idx[g, t, k] = -1
                    else:
                        seen[e] += 1
            if capacity == "pad":
                pad[g] = cap - seen
        weights = np.where(idx >= 0, weights, 0.0)
    return Routing(idx, weights, experts, pad, kind)


def _read_trace(path: str | None, ranks: int, tokens: int, experts: int, topk: int) -> np.ndarray:
    if not path:
        raise UserError("trace: the trace routing needs a file (trace=PATH)")
    p = Path(path)
    if not p.is_file():
        raise UserError(f"trace: file not found: {path}")
    try:
        arr = np.load(p) if p.suffix == ".npy" else np.asarray(json.loads(p.read_text())["topk_idx"])
    except (ValueError, KeyError, OSError, TypeError) as exc:
        raise UserError(f"trace: {path}: not a routing trace ({exc.__class__.__name__}); expected "
                        "JSON {\"topk_idx\": [[...], ...]} or a .npy [tokens, topk] array") from None
    arr = np.asarray(arr, dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != topk:
        raise UserError(f"trace: {path}: expected [tokens, {topk}] expert ids, got shape {list(arr.shape)}")
    if arr.shape[0] < ranks * tokens:
        raise UserError(f"trace: {path}: has {arr.shape[0]} tokens, the run needs {ranks * tokens} "
                        f"({ranks} ranks x {tokens})")
    if arr.max() >= experts or arr.min() < -1:
        raise UserError(f"trace: {path}: expert ids must lie in -1..{experts - 1}")
    return arr[:ranks * tokens].reshape(ranks, tokens, topk)


#: how an EP kernel's stack runs expert TP (:func:`expert_tp_routing`): ``group``
#: (Megatron-Core's all-to-all dispatcher: the all-to-all among the EP ranks of one
#: expert-TP index, then an AllGather and a ReduceScatter in each expert-TP group) or
#: ``all`` (its all-gather and flex dispatchers: one exchange over every GPU, a token's
#: rows to every GPU of its expert's expert-TP group, the partial sums added by the
#: combine)
EXPERT_TP_FORMS = ("group", "all")


def expert_tp_routing(rt: Routing, ep: int, tp: int, form: str) -> Routing:
    """``rt`` (drawn over ``ep * tp`` GPUs, each routing its own tokens, the experts split
    over ``ep`` EP ranks) as a routing over the GPUs' (expert, expert-TP slot) pairs, the
    virtual experts an EP kernel runs. Layout (Megatron-Core's expert rank order
    ``tp-ep``, expert TP fastest): GPU ``g`` is EP rank ``g // tp``, expert-TP slot
    ``g % tp``; virtual expert ``(r * tp + j) * per + l`` is local expert ``l`` of EP rank
    ``r``'s slot ``j`` (``per = experts / ep``), so it lives on GPU ``r * tp + j``.
    ``group``: a token of GPU ``g`` selects its experts' slot ``g % tp`` (the all-to-all
    stays among the GPUs of that slot); ``all``: every slot of each of its experts
    (top-k x ``tp``, the same gate weight each: Megatron's flex dispatcher expands its
    routing map so). Dropped selections stay dropped; padding rows go with the slot."""
    if form not in EXPERT_TP_FORMS:
        raise ValueError(f"form: '{form}'; valid: {', '.join(EXPERT_TP_FORMS)}")
    if rt.ranks != ep * tp or rt.experts % ep:
        raise ValueError(f"a routing over {rt.ranks} ranks and {rt.experts} experts is not EP {ep} x expert TP {tp}")
    if tp == 1:
        return rt
    per = rt.experts // ep
    idx = rt.topk_idx
    slot_of = (np.arange(rt.ranks) % tp)[:, None, None]

    def virtual(j: np.ndarray | int) -> np.ndarray:
        return np.where(idx >= 0, (idx // per * tp + j) * per + idx % per, -1)
    if form == "group":
        vidx, weights = virtual(slot_of), rt.weights
    else:
        vidx = np.stack([virtual(j) for j in range(tp)], axis=3).reshape(rt.ranks, rt.tokens, rt.topk * tp)
        weights = np.repeat(rt.weights, tp, axis=2)
    pad = np.zeros((0, 0), dtype=np.int64)
    if rt.pad_rows.size:
        pad = np.zeros((rt.ranks, rt.experts * tp), dtype=np.int64)
        e = np.arange(rt.experts)
        for g in range(rt.ranks):
            for j in ([g % tp] if form == "group" else range(tp)):
                pad[g, (e // per * tp + j) * per + e % per] = rt.pad_rows[g]
    return Routing(vidx.astype(np.int64), weights, rt.experts * tp, pad, rt.source)
