"""The unsharded numpy transformer layer: what every simulated TP scheme must reproduce
bit for bit (see docs/layer-semantics.md).

The layer stack is cut into *periods* that start at attention: a forward period takes
the residual x1 and the current layer's q, k, v, and ends with the next layer's q', k',
v' and the residual x3 (the next period's x1). A backward period runs the same ops in
reverse. Tokens are rows: T = batch*seq, row r = (batch r // seq, position r % seq).
Head-shaped tensors are [b, heads, s, d]; their [T, heads*d] form is head-major in
columns (column = head*d + j), matching the columns of wq/wk/wv and the rows of wo.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import numerics as nx


@dataclass(frozen=True)
class Dims:
    """The layer shape, taken from any spec-like object (e.g. a ModelSpec)."""

    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    gated: bool
    norm: str = "layernorm"
    activation: str = "gelu"

    @classmethod
    def of(cls, spec) -> "Dims":
        if isinstance(spec, Dims):
            return spec
        d = cls(spec.hidden, spec.ffn_hidden, spec.heads, spec.kv_heads or spec.heads,
                spec.head_dim or spec.hidden // spec.heads, bool(spec.gated_mlp),
                spec.norm, spec.activation)
        if d.gated != (d.activation == "swiglu"):
            raise ValueError("gated_mlp must be true exactly when activation is swiglu")
        if d.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"unknown norm {d.norm!r}")
        return d

    @property
    def q_w(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_w(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass
class LayerParams:
    ln1_g: np.ndarray
    ln1_b: np.ndarray | None  # None for rmsnorm
    wq: np.ndarray            # [h, q_w]
    wk: np.ndarray            # [h, kv_w]
    wv: np.ndarray            # [h, kv_w]
    wo: np.ndarray            # [q_w, h]
    ln2_g: np.ndarray
    ln2_b: np.ndarray | None
    w1: np.ndarray            # [h, f] (the gate GEMM when gated)
    w3: np.ndarray | None     # [h, f] up GEMM, gated only
    w2: np.ndarray            # [f, h]


def _grid(rng, shape, half_units):
    """Uniform multiples of 2**-10 in [-half_units, half_units] * 2**-10."""
    return rng.integers(-half_units, half_units + 1, size=shape).astype(np.float64) * nx.GRID


def make_params(spec_like, rng: np.random.Generator) -> LayerParams:
    """Q10 weights in [-0.125, 0.125], gammas in 1 +- 1/32, betas in +-1/16."""
    d = Dims.of(spec_like)
    h, f = d.hidden, d.ffn_hidden
    ln = d.norm == "layernorm"
    w = lambda *s: _grid(rng, s, 128)  # noqa: E731
    gam = lambda: 1.0 + _grid(rng, (h,), 32)  # noqa: E731
    bet = lambda: _grid(rng, (h,), 64) if ln else None  # noqa: E731
    return LayerParams(gam(), bet(), w(h, d.q_w), w(h, d.kv_w), w(h, d.kv_w), w(d.q_w, h),
                       gam(), bet(), w(h, f), w(h, f) if d.gated else None, w(f, h))


def make_inputs(spec_like, batch: int, seq: int, rng: np.random.Generator, scale=256):
    """Random on-grid period inputs: x1 [T, h] and q [b, hq, s, d], k, v [b, hkv, s, d]."""
    d = Dims.of(spec_like)
    x1 = _grid(rng, (batch * seq, d.hidden), 1024)
    q = _grid(rng, (batch, d.heads, seq, d.head_dim), scale)
    k = _grid(rng, (batch, d.kv_heads, seq, d.head_dim), scale)
    v = _grid(rng, (batch, d.kv_heads, seq, d.head_dim), scale)
    return x1, q, k, v


def to_rows(t):
    """[b, heads, s, d] -> [b*s, heads*d]."""
    b, hh, s, d = t.shape
    return np.ascontiguousarray(t.transpose(0, 2, 1, 3)).reshape(b * s, hh * d)


def to_heads(x, batch, heads):
    """[b*s, heads*d] -> [b, heads, s, d]."""
    t, w = x.shape
    y = x.reshape(batch, t // batch, heads, w // heads)
    return np.ascontiguousarray(y.transpose(0, 2, 1, 3))


def _infer(p: LayerParams, q) -> Dims:
    gated = p.w3 is not None
    return Dims(p.wo.shape[1], p.w1.shape[1], q.shape[1], p.wk.shape[1] // q.shape[3], q.shape[3],
                gated, "layernorm" if p.ln2_b is not None else "rmsnorm",
                "swiglu" if gated else "gelu")


def _act(d: Dims, f, u):
    return nx.swiglu(f, u) if d.gated else nx.gelu(f)


def _post_attention(a, x1, this, nxt, d: Dims, batch, rows, p_drop, seed):
    """Steps 2-7 of a forward period, from the attention output a [T, q_w]."""
    out = {"a": a}
    out["zo"] = zo = a @ this.wo
    out["x2"] = x2 = x1 + nx.dropout(zo, rows, p_drop, seed)
    out["n2"] = n2 = nx.norm(d.norm, x2, this.ln2_g, this.ln2_b)
    out["f"] = f = n2 @ this.w1
    out["u"] = u = n2 @ this.w3 if d.gated else None
    out["g"] = g = _act(d, f, u)
    out["zf"] = zf = g @ this.w2
    out["x3"] = x3 = x2 + nx.dropout(zf, rows, p_drop, seed + 1)
    out["n1"] = n1 = nx.norm(d.norm, x3, nxt.ln1_g, nxt.ln1_b)
    out["q_next"] = to_heads(n1 @ nxt.wq, batch, d.heads)  # GEMM outputs: exact, unquantised
    out["k_next"] = to_heads(n1 @ nxt.wk, batch, d.kv_heads)
    out["v_next"] = to_heads(n1 @ nxt.wv, batch, d.kv_heads)
    return out


def forward_period(x1, q, k, v, this: LayerParams, nxt: LayerParams, dims,
                   p_drop: float = 0.0, seed: int = 0) -> dict:
    """Attention of ``this`` layer .. QKV GEMM of ``nxt``. x1 [T, h]; q, k, v head-shaped.
    Returns a, zo, x2, n2, f, u (None unless gated), g, zf, x3, n1, q_next, k_next,
    v_next and the attention cache ``attn``."""
    d = Dims.of(dims)
    o, cache = nx.attention(q, k, v, causal=True)
    out = _post_attention(to_rows(o), x1, this, nxt, d, q.shape[0], np.arange(x1.shape[0]),
                          p_drop, seed)
    out["attn"] = cache
    return out


def backward_period(fwd: dict, x1, q, k, v, this: LayerParams, nxt: LayerParams,
                    d_q_next, d_k_next, d_v_next, dx3_res, p_drop: float = 0.0,
                    seed: int = 0, dims=None) -> dict:
    """QKV dgrad of ``nxt`` .. attention backward of ``this``. Gradients arrive as
    d_q_next/d_k_next/d_v_next (head-shaped) and dx3_res [T, h] (residual grad at x3).
    dx2 is the residual grad at x1 (the lower period's dx3_res); dq, dk, dv are the
    lower period's d_q_next etc. Weight grads: dWq_next, dWk_next, dWv_next, dln1_g,
    dln1_b (of ``nxt``), dW2, dW1, dW3, dln2_g, dln2_b, dWo (of ``this``). ``dims`` may
    be omitted: norm kind and gating are read off the params (beta None = rmsnorm)."""
    d = Dims.of(dims) if dims is not None else _infer(this, q)
    rows = np.arange(x1.shape[0])
    n1, x2, x3, n2 = fwd["n1"], fwd["x2"], fwd["x3"], fwd["n2"]
    dqn, dkn, dvn = to_rows(d_q_next), to_rows(d_k_next), to_rows(d_v_next)
    r = {}
    # L4: QKV dgrad -> LN bwd -> FC2 dgrad
    r["dn1"] = dn1 = dqn @ nxt.wq.T + dkn @ nxt.wk.T + dvn @ nxt.wv.T
    r["dWq_next"], r["dWk_next"], r["dWv_next"] = n1.T @ dqn, n1.T @ dkn, n1.T @ dvn
    dxn, r["dln1_g"], r["dln1_b"] = nx.norm_bwd(d.norm, dn1, x3, nxt.ln1_g)
    r["dx3"] = dx3 = dx3_res + dxn
    r["dzf"] = dzf = nx.dropout_bwd(dx3, rows, p_drop, seed + 1)
    r["dg"] = dg = dzf @ this.w2.T
    r["dW2"] = fwd["g"].T @ dzf
    # L3: FC1 dgrad -> LN bwd -> out-proj dgrad
    if d.gated:
        df, du = nx.swiglu_bwd(dg, fwd["f"], fwd["u"])
        dn2 = df @ this.w1.T + du @ this.w3.T
        r["dW3"] = n2.T @ du
    else:
        df, du = nx.gelu_bwd(dg, fwd["f"]), None
        dn2 = df @ this.w1.T
        r["dW3"] = None
    r["df"], r["du"], r["dn2"] = df, du, dn2
    r["dW1"] = n2.T @ df
    dxn, r["dln2_g"], r["dln2_b"] = nx.norm_bwd(d.norm, dn2, x2, this.ln2_g)
    r["dx2"] = dx2 = dx3 + dxn
    r["dzo"] = dzo = nx.dropout_bwd(dx2, rows, p_drop, seed)
    r["da"] = da = dzo @ this.wo.T
    r["dWo"] = fwd["a"].T @ dzo
    r["dq"], r["dk"], r["dv"] = nx.attention_bwd(to_heads(da, q.shape[0], d.heads), q, k, v,
                                                 fwd.get("attn"), causal=True)
    return r


def decode_step(x1, q, k_cache, v_cache, this: LayerParams, nxt: LayerParams, dims,
                p_drop: float = 0.0, seed: int = 0) -> dict:
    """Forward period for one new token per sequence: x1 [b, h], q [b, hq, 1, d], caches
    [b, hkv, L, d] that already hold the new token's k, v. Steps 2-7 as in
    :func:`forward_period` with T = b (dropout rows 0..b-1); q_next etc. are [b, *, 1, d]."""
    d = Dims.of(dims)
    a = to_rows(nx.attention_decode(q, k_cache, v_cache))
    return _post_attention(a, x1, this, nxt, d, q.shape[0], np.arange(x1.shape[0]), p_drop, seed)
