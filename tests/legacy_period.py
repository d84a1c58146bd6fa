"""The period as ``cais.workload.graph`` built it by hand before it was derived from the
dataflow graph (commit 3463cfe), kept verbatim as the reference that
``build_period`` must still equal (tests/test_dataflow.py)."""

from __future__ import annotations

from cais.workload.graph import (Chain, Dims, Gather, Gemm, GemmOperands, Local, MODES, Period, RowOp,
                                 dims_for)
from cais.workload.models import ModelSpec


def _forward(d: Dims, p: Period, seed: int) -> None:
    T, h, rl = d.tokens, d.hidden, d.rows_l
    gath = (lambda s: s + "g") if d.sp else (lambda s: s)
    p.buffers.update({"qkv": (T, d.qkv_l), "x1": (rl, h), "a": (T, d.q_l), "zo_p": (T, h), "zo": (rl, h),
                      "x2": (rl, h), "n2": (rl, h), "f": (T, d.fc1_l), "g": (T, d.ffn_l), "zf_p": (T, h),
                      "zf": (rl, h), "x3": (rl, h), "n1": (rl, h), "qkv_next": (T, d.qkv_l),
                      "wo": (d.q_l, h), "w1": (h, d.fc1_l), "w2": (d.ffn_l, h), "wqkv_next": (h, d.qkv_l)})
    if d.sp:
        p.buffers.update({"n2g": (T, h), "n1g": (T, h)})
    if p.mode == "decode":  # the KV cache (already holding the new token's k, v)
        p.buffers.update({"kcache": (d.batch * d.kv_l * d.kv_len, d.head_dim),
                          "vcache": (d.batch * d.kv_l * d.kv_len, d.head_dim)})
    p.segments.append(Local("attention", "attention"))
    p.segments.append(Chain(
        "L1", Gemm("out_proj", T, h, d.q_l, GemmOperands("a", "wo", "zo_p"), "fwd"), "zo",
        RowOp("dropout_add_ln2", "residual_norm", rl, h, {"x": "x1", "z": "zo"}, {"x": "x2", "n": "n2"}, "ln2", seed),
        "n2", gath("n2"), Gemm("fc1", T, d.fc1_l, h, GemmOperands(gath("n2"), "w1", "f"), "fwd")))
    p.segments.append(Local("activation", "act"))
    p.segments.append(Chain(
        "L2", Gemm("fc2", T, h, d.ffn_l, GemmOperands("g", "w2", "zf_p"), "fwd"), "zf",
        RowOp("dropout_add_ln1", "residual_norm", rl, h, {"x": "x2", "z": "zf"}, {"x": "x3", "n": "n1"}, "ln1n",
              seed + 1),
        "n1", gath("n1"), Gemm("qkv", T, d.qkv_l, h, GemmOperands(gath("n1"), "wqkv_next", "qkv_next"), "fwd")))


def _backward(d: Dims, p: Period, seed: int, regather: bool) -> None:
    T, h, rl = d.tokens, d.hidden, d.rows_l
    gath = (lambda s: s + "g") if d.sp else (lambda s: s)
    p.buffers.update({"dqkv_next": (T, d.qkv_l), "dx3_res": (rl, h), "dn1_p": (T, h), "dn1": (rl, h),
                      "dx3": (rl, h), "dzf": (rl, h), "dg": (T, d.ffn_l), "df": (T, d.fc1_l), "dn2_p": (T, h),
                      "dn2": (rl, h), "dx2": (rl, h), "dzo": (rl, h), "da": (T, d.q_l), "dqkv": (T, d.qkv_l),
                      "dwqkv_next": (h, d.qkv_l), "dw2": (d.ffn_l, h), "dw1": (h, d.fc1_l), "dwo": (d.q_l, h)})
    if d.sp:
        p.buffers.update({"dzfg": (T, h), "dzog": (T, h), "n2g": (T, h), "n1g": (T, h)})
    p.segments.append(Chain(
        "L4", Gemm("qkv_dgrad", T, h, d.qkv_l, GemmOperands("dqkv_next", "wqkv_next", "dn1_p", tb=True), "dgrad"),
        "dn1",
        RowOp("ln1_bwd", "norm_bwd", rl, h, {"dres": "dx3_res", "dz": "dn1", "x": "x3"}, {"dx": "dx3", "dzo": "dzf"},
              "ln1n", seed + 1),
        "dzf", gath("dzf"), Gemm("fc2_dgrad", T, d.ffn_l, h, GemmOperands(gath("dzf"), "w2", "dg", tb=True), "dgrad")))
    if d.sp and regather:
        p.segments.append(Gather("regather_n1", "n1", "n1g"))
    p.segments.append(Local("qkv_wgrad", "gemm", Gemm("qkv_wgrad", h, d.qkv_l, T,
                                                      GemmOperands(gath("n1"), "dqkv_next", "dwqkv_next", ta=True),
                                                      "wgrad")))
    p.segments.append(Local("fc2_wgrad", "gemm", Gemm("fc2_wgrad", d.ffn_l, h, T,
                                                      GemmOperands("g", gath("dzf"), "dw2", ta=True), "wgrad")))
    p.segments.append(Local("activation_bwd", "act_bwd"))
    p.segments.append(Chain(
        "L3", Gemm("fc1_dgrad", T, h, d.fc1_l, GemmOperands("df", "w1", "dn2_p", tb=True), "dgrad"), "dn2",
        RowOp("ln2_bwd", "norm_bwd", rl, h, {"dres": "dx3", "dz": "dn2", "x": "x2"}, {"dx": "dx2", "dzo": "dzo"},
              "ln2", seed),
        "dzo", gath("dzo"), Gemm("out_proj_dgrad", T, d.q_l, h, GemmOperands(gath("dzo"), "wo", "da", tb=True),
                                 "dgrad")))
    if d.sp and regather:
        p.segments.append(Gather("regather_n2", "n2", "n2g"))
    p.segments.append(Local("fc1_wgrad", "gemm", Gemm("fc1_wgrad", h, d.fc1_l, T,
                                                      GemmOperands(gath("n2"), "df", "dw1", ta=True), "wgrad")))
    p.segments.append(Local("out_proj_wgrad", "gemm", Gemm("out_proj_wgrad", d.q_l, h, T,
                                                           GemmOperands("a", gath("dzo"), "dwo", ta=True), "wgrad")))
    p.segments.append(Local("attention_bwd", "attention_bwd"))


def legacy_period(model: ModelSpec, n: int, mode: str, sp: bool, seed: int = 0, regather: bool = True,
                  kv_len: int | None = None) -> Period:
    """The period of ``model`` on ``n`` GPUs: ``train`` (forward + backward),
    ``prefill`` (forward) or ``decode`` (forward of one new token per sequence)."""
    if mode not in MODES:
        raise ValueError(f"--mode: unknown mode '{mode}'; valid: {', '.join(MODES)}")
    d = dims_for(model, n, mode, sp, kv_len)
    p = Period(d, mode, [])
    _forward(d, p, seed)
    if mode == "train":
        _backward(d, p, seed, regather)
    return p
