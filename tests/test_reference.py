"""The numerics of functional mode and the unsharded reference layer."""

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

from cais.workload import numerics as nx
from cais.workload import reference as ref


@contextlib.contextmanager
def _exact():
    """Unquantised math inside the block: ``quantize`` becomes the identity."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nx, "quantize", lambda x: np.asarray(x, dtype=np.float64))
        yield

GPT = dict(norm="layernorm", activation="gelu", gated_mlp=False)
LLAMA = dict(norm="rmsnorm", activation="swiglu", gated_mlp=True)


def spec(hidden, ffn, heads, kv_heads=None, head_dim=None, **kind):
    return SimpleNamespace(hidden=hidden, ffn_hidden=ffn, heads=heads, kv_heads=kv_heads,
                           head_dim=head_dim, **(kind or GPT))


def same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.array_equal(a, b), f"max diff {np.max(np.abs(a - b))}"


def on_grid(x):
    return np.array_equal(x, nx.quantize(x))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ---------------------------------------------------------------- (a) GEMM exactness

def _sharded(a, b, shards, rng):
    """a @ b with K split into ``shards`` pieces whose partials are summed in a random
    order (what a row-parallel GEMM plus an all-reduce does)."""
    parts = [x @ y for x, y in zip(np.array_split(a, shards, axis=1),
                                   np.array_split(b, shards, axis=0))]
    out = np.zeros((a.shape[0], b.shape[1]))
    for i in rng.permutation(shards):
        out = out + parts[i]
    return out


@pytest.mark.parametrize("kind", [GPT, LLAMA])
def test_gemm_partials_are_exact_in_any_order(kind, rng):
    s = spec(256, 1024, 8, 4, **kind)
    p, nxt = ref.make_params(s, rng), ref.make_params(s, rng)
    x1, q, k, v = ref.make_inputs(s, 2, 32, rng)
    fwd = ref.forward_period(x1, q, k, v, p, nxt, s, 0.1, 7)
    for name in ("a", "n2", "g", "n1", "x2", "x3"):
        assert on_grid(fwd[name]), name
    assert not on_grid(fwd["zo"])  # GEMM outputs are not quantised, yet exact
    for a, w in ((fwd["a"], p.wo), (fwd["n2"], p.w1), (fwd["g"], p.w2), (fwd["n1"], nxt.wq)):
        full = a @ w
        for shards in (2, 4, 8):
            same(_sharded(a, w, shards, rng), full)
        # reversed column order of K (another summation order inside the GEMM)
        same(a[:, ::-1] @ w[::-1], full)
        # the same GEMM on a subset of rows
        same(a[5:17] @ w, full[5:17])
    # a weight-gradient GEMM (sum over tokens) split by rows (sequence parallel)
    dzf = nx.quantize(rng.normal(size=fwd["zf"].shape))
    g = fwd["g"]
    same(g[32:].T @ dzf[32:] + g[:32].T @ dzf[:32], g.T @ dzf)


def test_float_sums_are_not_exact_without_the_grid(rng):
    """The test above can fail: off the grid, summation order changes the bits."""
    a, w = rng.normal(size=(64, 256)), rng.normal(size=(256, 64))
    assert not np.array_equal(_sharded(a, w, 8, rng), a @ w)


# ---------------------------------------------------------------- (b) row independence

ROWS = np.array([3, 17, 18, 40, 63])


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_norms_are_row_independent(norm, rng):
    x = ref._grid(rng, (64, 256), 2048)
    g, b = 1 + ref._grid(rng, (256,), 32), ref._grid(rng, (256,), 64)
    b = b if norm == "layernorm" else None
    dy = ref._grid(rng, (64, 256), 512)
    y = nx.norm(norm, x, g, b)
    assert on_grid(y)
    same(nx.norm(norm, x[ROWS], g, b), y[ROWS])
    dx, dg, db = nx.norm_bwd(norm, dy, x, g)
    sdx, sdg, sdb = nx.norm_bwd(norm, dy[ROWS], x[ROWS], g)
    same(sdx, dx[ROWS])
    # per-row-shard partial weight grads add up exactly, in any order
    parts = [nx.norm_bwd(norm, dy[i::4], x[i::4], g) for i in range(4)]
    same(parts[2][1] + parts[0][1] + parts[3][1] + parts[1][1], dg)
    if norm == "layernorm":
        same(parts[3][2] + parts[1][2] + parts[0][2] + parts[2][2], db)
    # a row alone, and rows in reversed order
    same(nx.norm(norm, x[7:8], g, b), y[7:8])
    same(nx.norm(norm, x[::-1].copy(), g, b), y[::-1])


def test_dropout_mask_is_keyed_by_global_indices(rng):
    m = nx.dropout_mask(np.arange(64), 256, 0.25, 5)
    assert set(np.unique(m)) == {0.0, 1.0}
    assert abs(1 - m.mean() - 0.25) < 0.02
    same(nx.dropout_mask(ROWS, 256, 0.25, 5), m[ROWS])
    same(nx.dropout_mask(ROWS, np.arange(100, 200), 0.25, 5), m[ROWS, 100:200])
    assert not np.array_equal(nx.dropout_mask(np.arange(64), 256, 0.25, 6), m)
    x = ref._grid(rng, (64, 256), 4096)
    y = nx.dropout(x, None, 0.25, 5)
    assert on_grid(y)
    same(nx.dropout(x[ROWS], ROWS, 0.25, 5), y[ROWS])
    same(nx.dropout(x[:, 100:200], None, 0.25, 5, cols=np.arange(100, 200)), y[:, 100:200])
    same(nx.dropout_bwd(x[ROWS], ROWS, 0.25, 5), y[ROWS])
    same(y[m == 0], np.zeros(int((m == 0).sum())))
    same(nx.dropout(x, None, 0.0, 5), x)  # p = 0 on grid is the identity


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_activations_are_row_independent(act, rng):
    f = rng.integers(-2**13, 2**13, size=(64, 128)) * 2.0**-10
    u = rng.integers(-2**13, 2**13, size=(64, 128)) * 2.0**-10
    dy = ref._grid(rng, (64, 128), 1024)
    if act == "gelu":
        y, d = nx.gelu(f), (nx.gelu_bwd(dy, f),)
        ys, ds = nx.gelu(f[ROWS]), (nx.gelu_bwd(dy[ROWS], f[ROWS]),)
    else:
        y, d = nx.swiglu(f, u), nx.swiglu_bwd(dy, f, u)
        ys, ds = nx.swiglu(f[ROWS], u[ROWS]), nx.swiglu_bwd(dy[ROWS], f[ROWS], u[ROWS])
    assert on_grid(y) and all(on_grid(t) for t in d)
    same(ys, y[ROWS])
    for a, b in zip(ds, d):
        same(a, b[ROWS])


# ---------------------------------------------------------------- (c) head independence

@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2), (8, 1)])
def test_attention_is_head_independent(hq, hkv, rng):
    b, s, d = 2, 24, 16
    q, k, v = (ref._grid(rng, (b, h, s, d), 512) for h in (hq, hkv, hkv))
    q, k = q + 2.0**-20, k - 2.0**-19  # off-grid, like QKV GEMM outputs
    do = ref._grid(rng, (b, hq, s, d), 512) + 2.0**-20
    o, cache = nx.attention(q, k, v)
    dq, dk, dv = nx.attention_bwd(do, q, k, v, cache)
    assert all(on_grid(t) for t in (o, dq, dk, dv))
    same(nx.attention_bwd(do, q, k, v, None)[0], dq)  # recomputing P gives the same bits
    g = hq // hkv
    for kv in range(hkv):  # one "GPU" per kv head, holding its whole query group
        hs, ks = slice(kv * g, (kv + 1) * g), slice(kv, kv + 1)
        o2, c2 = nx.attention(q[:, hs], k[:, ks], v[:, ks])
        same(o2, o[:, hs])
        dq2, dk2, dv2 = nx.attention_bwd(do[:, hs], q[:, hs], k[:, ks], v[:, ks], c2)
        same(dq2, dq[:, hs])
        same(dk2, dk[:, ks])
        same(dv2, dv[:, ks])
    if g > 1:  # a query group split over two GPUs (kv head replicated): dk/dv partials add
        lo, hi = slice(0, g // 2), slice(g // 2, g)
        pl = nx.attention_bwd(do[:, lo], q[:, lo], k[:, :1], v[:, :1])
        ph = nx.attention_bwd(do[:, hi], q[:, hi], k[:, :1], v[:, :1])
        same(ph[1] + pl[1], dk[:, :1])
        same(ph[2] + pl[2], dv[:, :1])
    # the batch split too
    same(nx.attention(q[1:], k[1:], v[1:])[0], o[1:])


def test_causal_mask_and_decode(rng):
    b, h, s, d = 2, 4, 12, 8
    q, k, v = (ref._grid(rng, (b, h, s, d), 512) for _ in range(3))
    o, cache = nx.attention(q, k, v)
    assert np.allclose(np.triu(cache["P"][0, 0], 1), 0)
    v2 = v.copy()
    v2[:, :, -1] += 1.0  # the last key is invisible to every earlier query
    same(nx.attention(q, k, v2)[0][:, :, :-1], o[:, :, :-1])
    for t in (0, 5, s - 1):
        same(nx.attention_decode(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1]),
             o[:, :, t:t + 1])


# ---------------------------------------------------------------- (d) gradients

def _fd(f, x, idx, eps=1e-6):
    old = x[idx]
    x[idx] = old + eps
    hi = f()
    x[idx] = old - eps
    lo = f()
    x[idx] = old
    return (hi - lo) / (2 * eps)


@pytest.mark.parametrize("kind,p_drop", [(GPT, 0.0), (GPT, 0.3), (LLAMA, 0.2)])
def test_backward_period_matches_finite_differences(kind, p_drop, rng):
    s = spec(16, 24, 4, 2, 4, **kind)
    b, sq = 2, 5
    this, nxt = ref.make_params(s, rng), ref.make_params(s, rng)
    # larger, smoother norm weights so every path matters
    x1, q, k, v = ref.make_inputs(s, b, sq, rng, scale=1024)
    fwd0 = ref.forward_period(x1, q, k, v, this, nxt, s, p_drop, 3)
    rq, rk, rv = (rng.normal(size=fwd0[n].shape) for n in ("q_next", "k_next", "v_next"))
    r3 = rng.normal(size=x1.shape)

    def loss():
        o = ref.forward_period(x1, q, k, v, this, nxt, s, p_drop, 3)
        return (np.sum(rq * o["q_next"]) + np.sum(rk * o["k_next"]) + np.sum(rv * o["v_next"])
                + np.sum(r3 * o["x3"]))

    with _exact():
        fwd = ref.forward_period(x1, q, k, v, this, nxt, s, p_drop, 3)
        g = ref.backward_period(fwd, x1, q, k, v, this, nxt, rq, rk, rv, r3, p_drop, 3)
        checks = [("dx2", x1), ("dq", q), ("dk", k), ("dv", v), ("dWo", this.wo),
                  ("dW1", this.w1), ("dW2", this.w2), ("dln2_g", this.ln2_g),
                  ("dWq_next", nxt.wq), ("dWv_next", nxt.wv), ("dln1_g", nxt.ln1_g)]
        if kind is GPT:
            checks += [("dln2_b", this.ln2_b), ("dln1_b", nxt.ln1_b)]
        else:
            checks += [("dW3", this.w3)]
        for name, arr in checks:
            grad = g[name]
            assert grad.shape == arr.shape, name
            for _ in range(6):
                idx = tuple(rng.integers(0, n) for n in arr.shape)
                num = _fd(loss, arr, idx)
                assert abs(num - grad[idx]) <= 1e-6 * max(1.0, abs(num)), (name, idx, num)
    # quantised backward stays close to the exact one and on the grid
    gq = ref.backward_period(fwd0, x1, q, k, v, this, nxt, nx.quantize(rq), nx.quantize(rk),
                             nx.quantize(rv), nx.quantize(r3), p_drop, 3)
    assert on_grid(gq["dx2"]) and on_grid(gq["dq"])
    assert np.max(np.abs(gq["dx2"] - g["dx2"])) < 0.05 * np.max(np.abs(g["dx2"])) + 0.01


@pytest.mark.parametrize("op", ["layernorm", "rmsnorm", "gelu", "swiglu", "attention"])
def test_numerics_grads_match_finite_differences(op, rng):
    x = rng.normal(size=(3, 8))
    u, gam, bet = rng.normal(size=(3, 8)), 1 + 0.1 * rng.normal(size=8), rng.normal(size=8)
    q, k, v = (rng.normal(size=(1, h, 5, 3)) for h in (4, 2, 2))
    with _exact():
        if op == "attention":
            r = rng.normal(size=q.shape)
            loss = lambda: np.sum(r * nx.attention(q, k, v)[0])  # noqa: E731
            pairs = zip((q, k, v), nx.attention_bwd(r, q, k, v))
        else:
            r = rng.normal(size=x.shape)
            fwd = {"layernorm": lambda: nx.layernorm(x, gam, bet),
                   "rmsnorm": lambda: nx.rmsnorm(x, gam),
                   "gelu": lambda: nx.gelu(x), "swiglu": lambda: nx.swiglu(x, u)}[op]
            loss = lambda: np.sum(r * fwd())  # noqa: E731
            grads = {"layernorm": lambda: zip((x, gam, bet), nx.layernorm_bwd(r, x, gam)),
                     "rmsnorm": lambda: zip((x, gam), nx.rmsnorm_bwd(r, x, gam)),
                     "gelu": lambda: [(x, nx.gelu_bwd(r, x))],
                     "swiglu": lambda: zip((x, u), nx.swiglu_bwd(r, x, u))}[op]
            pairs = grads()
        for arr, grad in pairs:
            num = np.zeros_like(arr)
            for idx in np.ndindex(arr.shape):
                num[idx] = _fd(loss, arr, idx)
            np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- decode, determinism

@pytest.mark.parametrize("kind", [GPT, LLAMA])
def test_decode_step_equals_last_prefill_row(kind, rng):
    s = spec(64, 128, 4, 2, **kind)
    b, sq = 3, 10
    this, nxt = ref.make_params(s, rng), ref.make_params(s, rng)
    x1, q, k, v = ref.make_inputs(s, b, sq, rng)
    fwd = ref.forward_period(x1, q, k, v, this, nxt, s)
    last = np.arange(b) * sq + sq - 1
    dec = ref.decode_step(x1[last], q[:, :, -1:], k, v, this, nxt, s)
    for name in ("a", "zo", "x2", "n2", "f", "g", "zf", "x3", "n1"):
        same(dec[name], fwd[name][last])
    for name in ("q_next", "k_next", "v_next"):
        same(dec[name], fwd[name][:, :, -1:])


def test_determinism_and_shapes(rng):
    s = spec(64, 96, 4, 2, 20, **LLAMA)  # q_w = 80 != hidden
    runs = []
    for _ in range(2):
        r = np.random.default_rng(99)
        this, nxt = ref.make_params(s, r), ref.make_params(s, r)
        x1, q, k, v = ref.make_inputs(s, 2, 8, r)
        f = ref.forward_period(x1, q, k, v, this, nxt, s, 0.1, 11)
        gr = ref.backward_period(f, x1, q, k, v, this, nxt, nx.quantize(f["q_next"]),
                                 nx.quantize(f["k_next"]), nx.quantize(f["v_next"]), x1, 0.1, 11)
        runs.append((f, gr))
    (f1, g1), (f2, g2) = runs
    for key, val in list(f1.items()) + list(g1.items()):
        if isinstance(val, np.ndarray):
            same(val, f2[key] if key in f2 else g2[key])
    assert f1["a"].shape == (16, 80) and f1["q_next"].shape == (2, 4, 8, 20)
    assert f1["k_next"].shape == (2, 2, 8, 20) and g1["dk"].shape == (2, 2, 8, 20)
    assert g1["dWq_next"].shape == (64, 80) and g1["dW3"].shape == (64, 96)
    p = ref.make_params(s, rng)
    assert p.ln1_b is None and on_grid(p.wq) and np.abs(p.wq).max() <= 0.125
    with pytest.raises(ValueError):
        ref.Dims.of(spec(64, 96, 4, activation="swiglu", gated_mlp=False, norm="rmsnorm"))
