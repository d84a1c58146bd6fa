"""The math of one transformer layer, shared by the unsharded reference
(:mod:`cais.workload.reference`) and the simulated kernels of functional mode.

Every array is float64. Bit-exact agreement between a sharded scheme and the reference,
whatever order its GEMMs and collectives add partial sums in, comes from a fixed-point
grid: each non-linear op rounds its OUTPUT to multiples of ``GRID`` = 2**-10 (Q10). With
inputs and weights on the grid, a GEMM's products are multiples of 2**-20 and every sum
of them is exact in float64, so order does not matter. The residual stream stays on the
grid because dropout (which every sub-layer output passes through) always quantises.
Row-wise ops use only their own row; attention uses only its own head. See
docs/layer-semantics.md.

Tests that need unquantised math (finite-difference gradient checks) replace
``quantize`` by the identity for the duration of the check.
"""

from __future__ import annotations

import math

import numpy as np

GRID = 2.0**-10


def quantize(x):
    """Round to the Q10 grid."""
    return np.round(np.asarray(x, dtype=np.float64) * 1024.0) / 1024.0


# ---------------------------------------------------------------- norms (row-wise)

def _stats(x, eps, centre):
    """Per-row mean and 1/std. Sums of x and x*x of on-grid rows are exact, so the
    statistics do not depend on how numpy orders the additions."""
    n = x.shape[-1]
    mu = x.sum(-1, keepdims=True) / n if centre else np.zeros(x.shape[:-1] + (1,))
    var = np.maximum((x * x).sum(-1, keepdims=True) / n - mu * mu, 0.0)
    return mu, 1.0 / np.sqrt(var + eps)


def layernorm(x, gamma, beta, eps=1e-5):
    mu, rstd = _stats(x, eps, True)
    return quantize((x - mu) * rstd * gamma + beta)


def layernorm_bwd(dy, x, gamma, eps=1e-5):
    """-> (dx, dgamma, dbeta). dgamma/dbeta are sums over rows of quantised per-row
    terms, so partial sums over row shards add up to them exactly."""
    mu, rstd = _stats(x, eps, True)
    xhat = (x - mu) * rstd
    g = dy * gamma
    dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return quantize(dx), quantize(dy * xhat).sum(0), quantize(dy).sum(0)


def rmsnorm(x, gamma, eps=1e-5):
    _, rstd = _stats(x, eps, False)
    return quantize(x * rstd * gamma)


def rmsnorm_bwd(dy, x, gamma, eps=1e-5):
    """-> (dx, dgamma)."""
    _, rstd = _stats(x, eps, False)
    xhat = x * rstd
    g = dy * gamma
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True))
    return quantize(dx), quantize(dy * xhat).sum(0)


def norm(kind: str, x, gamma, beta=None, eps=1e-5):
    """Dispatch on ``kind`` in {"layernorm", "rmsnorm"}."""
    return layernorm(x, gamma, beta, eps) if kind == "layernorm" else rmsnorm(x, gamma, eps)


def norm_bwd(kind: str, dy, x, gamma, eps=1e-5):
    """-> (dx, dgamma, dbeta or None)."""
    if kind == "layernorm":
        return layernorm_bwd(dy, x, gamma, eps)
    return (*rmsnorm_bwd(dy, x, gamma, eps), None)


# ---------------------------------------------------------------- activations

_C = math.sqrt(2.0 / math.pi)


def gelu(x):
    return quantize(0.5 * x * (1.0 + np.tanh(_C * (x + 0.044715 * x**3))))


def gelu_bwd(dy, x):
    t = np.tanh(_C * (x + 0.044715 * x**3))
    d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _C * (1.0 + 3 * 0.044715 * x * x)
    return quantize(dy * d)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def swiglu(gate, up):
    return quantize(gate * _sigmoid(gate) * up)


def swiglu_bwd(dy, gate, up):
    """-> (dgate, dup)."""
    s = _sigmoid(gate)
    return quantize(dy * up * s * (1.0 + gate * (1.0 - s))), quantize(dy * gate * s)


# ---------------------------------------------------------------- dropout

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix64(z):
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def dropout_mask(rows, cols, p: float, seed: int):
    """0/1 float mask [len(rows), ncols], keyed only by (seed, global row, global column):
    bit (r, c) = splitmix64(seed*2**40 + r*2**20 + c) / 2**64 >= p. ``cols`` is a column
    count (columns 0..cols-1) or an array of global column indices."""
    rows = np.asarray(rows, dtype=np.uint64).reshape(-1, 1)
    cols = np.arange(cols) if np.isscalar(cols) else np.asarray(cols)
    cols = cols.astype(np.uint64).reshape(1, -1)
    key = (np.uint64(seed % 2**24) << np.uint64(40)) + (rows << np.uint64(20)) + cols
    u = (_splitmix64(key) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return (u >= p).astype(np.float64)


def _rows(x, rows):
    return np.arange(x.shape[0]) if rows is None else rows


def dropout(x, rows, p: float, seed: int, cols=None):
    """quantize(x * mask / (1 - p)); ``rows``/``cols`` are the global indices of x's rows
    and columns (None: 0..n-1). Always quantises, also at p = 0."""
    if p == 0.0:
        return quantize(x)
    cols = x.shape[-1] if cols is None else cols
    return quantize(x * dropout_mask(_rows(x, rows), cols, p, seed) / (1.0 - p))


def dropout_bwd(dy, rows, p: float, seed: int, cols=None):
    return dropout(dy, rows, p, seed, cols)


# ---------------------------------------------------------------- attention (per head)

def _expand(kv, hq):
    """[b, hkv, L, d] -> [b, hq, L, d]: query head j reads kv head j // (hq // hkv)."""
    if kv.shape[1] == hq:
        return kv
    assert hq % kv.shape[1] == 0, "query heads must be a multiple of kv heads"
    return np.repeat(kv, hq // kv.shape[1], axis=1)


def _probs(q, k, causal):
    """P = softmax(q k^T / sqrt(d)) with q, k already on the grid (scores exact)."""
    sq, sk = q.shape[-2], k.shape[-2]
    s = (q @ np.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:  # query i sits at position i + sk - sq
        s = np.where(np.triu(np.ones((sq, sk), bool), k=1 + sk - sq), -np.inf, s)
    e = np.exp(s - s.max(-1, keepdims=True))
    return quantize(e / e.sum(-1, keepdims=True))


def attention(q, k, v, causal=True):
    """q [b, hq, s, d], k/v [b, hkv, L, d] -> (out [b, hq, s, d], cache).

    The kernel rounds q, k, v to the grid on load (the bf16 copies a real QKV GEMM
    writes), quantises P and O. Causal: query i sees keys 0..i + L - s."""
    hq = q.shape[1]
    qq, kk, vv = quantize(q), quantize(_expand(k, hq)), quantize(_expand(v, hq))
    p = _probs(qq, kk, causal)
    return quantize(p @ vv), {"P": p}


def attention_bwd(dout, q, k, v, cache=None, causal=True):
    """-> (dq, dk, dv). dk/dv of a kv head are sums of quantised per-query-head terms,
    so query heads of one group split over GPUs give partials that add up exactly."""
    b, hq, _, d = q.shape
    hkv = k.shape[1]
    qq, kk, vv = quantize(q), quantize(_expand(k, hq)), quantize(_expand(v, hq))
    do = quantize(dout)
    p = cache["P"] if cache is not None else _probs(qq, kk, causal)
    dp = do @ np.swapaxes(vv, -1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    scale = 1.0 / math.sqrt(d)
    dq = quantize((ds @ kk) * scale)
    dk = quantize((np.swapaxes(ds, -1, -2) @ qq) * scale)
    dv = quantize(np.swapaxes(p, -1, -2) @ do)
    g = hq // hkv
    dk = dk.reshape(b, hkv, g, *dk.shape[2:]).sum(2)
    dv = dv.reshape(b, hkv, g, *dv.shape[2:]).sum(2)
    return dq, dk, dv


def attention_decode(q, k_cache, v_cache):
    """One new token per sequence: q [b, hq, 1, d] over caches [b, hkv, L, d] (which
    already hold the new token's k, v). Same bits as the last row of a causal prefill."""
    return attention(q, k_cache, v_cache, causal=False)[0]
