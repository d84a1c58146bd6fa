"""Run one period of a transformer layer under one scheme, and (in functional mode)
check every GPU's tensors against the unsharded numpy layer."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from cais.hw.compute import ComputeModel
from cais.errors import UserError
from cais.workload.dims import MODES
from cais.config import PS_PER_US, MoeConfig, SystemConfig
from cais.experiments.estimates import moe_period_events, period_events
from cais.limits import TooBig, check_events, check_machine
from cais.engine.sim import fewer_collections
from cais.machine import Machine, Stalled
from cais.experiments.collective import SIM_MODES, check_mirror, mirror_misfit
from cais.experiments.ep import expert_block_check, own_bytes
from cais.experiments.token import TokenTime, graph_batch, graph_padded, moe_token_time, token_time
from cais.results import LinkUtil, Recorder, RunMetrics, run_metrics
from cais.results.metrics import mirrored
from cais.kernels.ep_registry import EP_KERNELS, check_dispatch_dtype, expert_tp_form
from cais.kernels.ep_registry import check_capacity as check_capacity_mode
from cais.schemes import MOE_FAMILY, get_scheme, moe_schemes
from cais.schemes.base import LayerRun, Scheme
from cais.schemes.ep import FUSED_MARK
from cais.workload import reference as ref
from cais.workload.footprint import Footprint, check_fits, footprint, over_capacity
from cais.workload.moe_footprint import moe_footprint
from cais.workload.graph import Chain, MoeStep, Period, build_period
from cais.workload.moe import MoeSpec
from cais.workload.moe_dataflow import (attention_group, attention_model, build_moe_period, dense_layer_model,
                                        dense_tp_group, ep_plan)
from cais.workload.routing import imbalance
from cais.provenance import Provenance
from cais.workload.models import ModelSpec

if TYPE_CHECKING:
    from cais.progress import RunProgress


@dataclass
class LayerResult:
    """Times of one period: total, per paper sub-layer (with its lower bound), and the
    fabric metrics over the period (link utilisation, wire bytes, buffer peaks); in
    functional mode, which tensors matched the reference. ``tokens`` are the real
    token rows, ``padded_tokens`` the rows the activations between the GEMMs carry
    (with sequence parallelism padded up to a multiple of ``gpus``; else equal)."""

    model: str
    scheme: str
    mode: str
    gpus: int
    sms: int
    total_us: float
    sublayers: dict[str, dict[str, float]]
    segments: dict[str, float]
    metrics: RunMetrics
    events: int
    wall_s: float
    kernel_us: dict[str, float] = field(default_factory=dict)
    # GPU 0's kernels by name: SM time their TBs held SMs ("tb_us") and the part spent
    # waiting there for data, flags or TB-group syncs ("tb_wait_us"), summed over TBs
    kernel_tbs: dict[str, dict[str, float]] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    checked: int = 0
    switch: str = ""
    vc_policy: str = ""
    tokens: int = 0
    padded_tokens: int = 0
    sim: str = "full"  # "full": every GPU simulated; "mirror": GPU 0 only (cais.experiments.collective)
    memory: Footprint | None = None  # the run's per-GPU HBM footprint (cais.workload.footprint)
    hbm_capacity_GB: float = 0.0  # the GPU's HBM it was checked against
    collective_choice: str = "scheme"  # collective.layer_choice: the scheme's, or NCCL's by size
    collectives_ran: dict[str, int] = field(default_factory=dict)  # "algo/protocol" -> NCCL calls (choice nccl)
    adjusted: dict[str, str] = field(default_factory=dict)  # settings not honoured as given -> what ran instead
    provenance: Provenance | None = None  # what made it (LayerSpec.run sets it; cais.provenance)
    token: TokenTime | None = None  # decode: the whole model's time per output token (experiments/token.py)
    moe: dict[str, object] | None = None  # a MoE layer's expert block (moe_breakdown)

    @property
    def padding(self) -> int:
        """Zero token rows added so that the rows split over the GPUs."""
        return self.padded_tokens - self.tokens

    @property
    def link_util(self) -> LinkUtil:
        return self.metrics.link_util

    def as_json(self) -> dict[str, object]:
        return {"model": self.model, "scheme": self.scheme, "mode": self.mode, "gpus": self.gpus, "sms": self.sms,
                "switch": self.switch, "vc_policy": self.vc_policy,
                "tokens": self.tokens, "padded_tokens": self.padded_tokens,
                "total_us": self.total_us, "sublayers": self.sublayers, **self.metrics.as_json(),
                "segments_us": self.segments, "kernel_us": self.kernel_us,
                "kernels": self.kernel_tbs, "sim": self.sim,
                "collectives": {"choice": self.collective_choice, "ran": self.collectives_ran},
                **({"adjusted": self.adjusted} if self.adjusted else {}),
                **({"memory": {**self.memory.as_json(), "capacity_GB": self.hbm_capacity_GB}}
                   if self.memory is not None else {}),
                **({"token_us": self.token.token_us, "token": self.token.as_json()} if self.token is not None else {}),
                **({"moe": self.moe} if self.moe is not None else {}),
                **({"provenance": self.provenance.flat()} if self.provenance is not None else {})}


def chain_bound_ps(r: LayerRun, c: Chain) -> tuple[int, int]:
    """(compute, communication) lower bounds of a sub-layer (:meth:`LayerRun.chain_bound_ps`)."""
    return r.chain_bound_ps(c)


def _shard_cols(d, g: int) -> tuple[slice, slice, slice]:
    hd = d.head_dim
    return (slice(g * d.q_l, (g + 1) * d.q_l), slice(g * d.kv_l * hd, (g + 1) * d.kv_l * hd),
            slice(g * d.ffn_l, (g + 1) * d.ffn_l))


class FunctionalCase:
    """Inputs, weights and expected tensors of one period, sharded per GPU.

    With padded token rows (``Dims.pad``, sequence parallelism) the inputs get zero
    rows after the real ones, and the expected activations get NaN rows there: the
    checker compares the real rows exactly and requires the padded ones to be finite
    (zero in gradients), so nothing of theirs can have leaked into real rows."""

    def __init__(self, model: ModelSpec, period: Period, p_drop: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        d = period.dims
        if model.kv < d.n:
            raise UserError("functional mode needs kv_heads >= GPUs (no replicated KV heads)")
        self.d, self.period, self.model = d, period, model
        self.this, self.nxt = ref.make_params(model, rng), ref.make_params(model, rng)
        if period.mode == "decode":  # one new token per sequence over a cache of kv_len
            x1, _, kc, vc = ref.make_inputs(model, model.batch, d.kv_len, rng)
            x1, q, k, v = ref.make_inputs(model, model.batch, 1, rng)
            kc[:, :, -1:], vc[:, :, -1:] = k, v
            self.kcache, self.vcache = kc, vc
            self.fwd = ref.decode_step(x1, q, kc, vc, self.this, self.nxt, model, p_drop, seed)
        else:
            x1, q, k, v = ref.make_inputs(model, model.batch, model.seq, rng)
            self.fwd = ref.forward_period(x1, q, k, v, self.this, self.nxt, model, p_drop, seed)
        self.x1, self.q, self.k, self.v = x1, q, k, v
        self.bwd = None
        if period.mode == "train":
            self.dqn = ref._grid(rng, self.fwd["q_next"].shape, 256)
            self.dkn = ref._grid(rng, self.fwd["k_next"].shape, 256)
            self.dvn = ref._grid(rng, self.fwd["v_next"].shape, 256)
            self.dx3_res = ref._grid(rng, x1.shape, 1024)
            self.bwd = ref.backward_period(self.fwd, x1, q, k, v, self.this, self.nxt, self.dqn, self.dkn,
                                           self.dvn, self.dx3_res, p_drop, seed, model)

    def _qkv(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: int) -> np.ndarray:
        d = self.d
        qh, kh = slice(g * d.heads_l, (g + 1) * d.heads_l), slice(g * d.kv_l, (g + 1) * d.kv_l)
        return np.hstack([ref.to_rows(q[:, qh]), ref.to_rows(k[:, kh]), ref.to_rows(v[:, kh])])

    def _wqkv(self, p: ref.LayerParams, g: int) -> np.ndarray:
        qc, kc, _ = _shard_cols(self.d, g)
        return np.hstack([p.wq[:, qc], p.wk[:, kc], p.wv[:, kc]])

    def _fc1(self, a: np.ndarray, b: np.ndarray | None, g: int) -> np.ndarray:
        fc = _shard_cols(self.d, g)[2]
        return np.hstack([a[:, fc], b[:, fc]]) if b is not None else a[:, fc]

    def _pad(self, x: np.ndarray, fill: float = 0.0) -> np.ndarray:
        """``x`` [real tokens, cols] with the padded rows (``fill``) appended."""
        pad = self.d.pad
        return np.vstack([x, np.full((pad, x.shape[1]), fill)]) if pad else x

    def _rows(self, x: np.ndarray, g: int, fill: float = 0.0) -> np.ndarray:
        """GPU ``g``'s rows of a token-row activation (its shard with SP), padded."""
        rl, x = self.d.rows_l, self._pad(x, fill)
        return x[g * rl:(g + 1) * rl] if self.d.sp else x

    def inputs(self, g: int) -> dict[str, np.ndarray]:
        t, nx_, qc = self.this, self.nxt, _shard_cols(self.d, g)[0]
        fc = _shard_cols(self.d, g)[2]
        buf = {"qkv": self._pad(self._qkv(self.q, self.k, self.v, g)), "x1": self._rows(self.x1, g),
               "wo": t.wo[qc],
               "w1": self._fc1(t.w1, t.w3, g), "w2": t.w2[fc], "wqkv_next": self._wqkv(nx_, g),
               "ln2_g": t.ln2_g, "ln1n_g": nx_.ln1_g}
        if t.ln2_b is not None:
            buf.update({"ln2_b": t.ln2_b, "ln1n_b": nx_.ln1_b})
        if self.period.mode == "decode":
            kh = slice(g * self.d.kv_l, (g + 1) * self.d.kv_l)
            buf["kcache"], buf["vcache"] = self.kcache[:, kh], self.vcache[:, kh]
        if self.bwd is not None:
            buf["dqkv_next"] = self._pad(self._qkv(self.dqn, self.dkn, self.dvn, g))
            buf["dx3_res"] = self._rows(self.dx3_res, g)
        return buf

    def expected(self, g: int) -> dict[str, np.ndarray]:
        """GPU ``g``'s expected tensors; padded token rows are NaN (not compared)."""
        f, qc, fc = self.fwd, _shard_cols(self.d, g)[0], _shard_cols(self.d, g)[2]
        nan = np.nan

        def rows(x: np.ndarray) -> np.ndarray:
            return self._rows(x, g, nan)

        def full(x: np.ndarray) -> np.ndarray:
            return self._pad(x, nan)
        exp = {"a": full(f["a"][:, qc]), "x2": rows(f["x2"]), "n2": rows(f["n2"]),
               "g": full(f["g"][:, fc]), "x3": rows(f["x3"]), "n1": rows(f["n1"]),
               "qkv_next": full(self._qkv(f["q_next"], f["k_next"], f["v_next"], g))}
        b = self.bwd
        if b is not None:
            kc = _shard_cols(self.d, g)[1]
            exp.update({"dx3": rows(b["dx3"]), "dg": full(b["dg"][:, fc]), "dx2": rows(b["dx2"]),
                        "da": full(b["da"][:, qc]), "dqkv": full(self._qkv(b["dq"], b["dk"], b["dv"], g)),
                        "dwo": b["dWo"][qc], "dw2": b["dW2"][fc], "dw1": self._fc1(b["dW1"], b["dW3"], g),
                        "dwqkv_next": np.hstack([b["dWq_next"][:, qc], b["dWk_next"][:, kc], b["dWv_next"][:, kc]])})
        return exp

    def expected_norm_grads(self) -> dict[str, np.ndarray]:
        if self.bwd is None:
            return {}
        out = {"dln2_g": self.bwd["dln2_g"], "dln1n_g": self.bwd["dln1_g"]}
        if self.bwd["dln2_b"] is not None:
            out.update({"dln2_b": self.bwd["dln2_b"], "dln1n_b": self.bwd["dln1_b"]})
        return out


def _alloc(m: Machine, period: Period, case: FunctionalCase) -> None:
    for g, gpu in enumerate(m.gpus):
        given = case.inputs(g)
        for name, (rows, cols) in period.buffers.items():
            gpu.memory.alloc(name, rows * cols, fill=given[name].reshape(-1) if name in given else None)
        for name in ("ln2_g", "ln2_b", "ln1n_g", "ln1n_b"):
            if name in given:
                gpu.memory.alloc(name, len(given[name]), fill=given[name])
                gpu.memory.alloc("d" + name, len(given[name]))


def _matches(name: str, got: np.ndarray, want: np.ndarray) -> bool:
    """Real rows equal bit for bit; padded rows (NaN in ``want``) finite, and zero in
    a gradient (``d*``: nothing flows back from a padded row)."""
    if got.shape != want.shape:
        return False
    pad = np.isnan(want).all(axis=1)
    if not np.array_equal(got[~pad], want[~pad]):
        return False
    return bool(np.all(got[pad] == 0) if name.startswith("d") else np.isfinite(got[pad]).all())


def _check(m: Machine, case: FunctionalCase) -> tuple[list[str], int]:
    bad, checked = [], 0
    for g, gpu in enumerate(m.gpus):
        for name, want in case.expected(g).items():
            checked += 1
            if not _matches(name, gpu.memory.matrix(name, want.shape[1]), want):
                bad.append(f"gpu{g}:{name}")
    for name, want in case.expected_norm_grads().items():
        checked += 1
        parts = [gpu.memory.buffers[name] for gpu in m.gpus]
        got = np.sum(parts, axis=0) if case.d.sp else parts[0]
        if not np.array_equal(got, want):
            bad.append(f"sum:{name}")
    return bad, checked


def _check_sms(cfg: SystemConfig, sms: int | None) -> None:
    if sms is not None and not 1 <= sms <= cfg.gpu.sms:
        raise UserError(f"sms: must be between 1 and {cfg.gpu.sms} on {cfg.name}, got {sms}")


# Schemes whose every GPU runs GPU 0's program shifted by its index, checked against
# the full model (docs/validation.md section 10); the others (CAIS's merge unit pairs
# requests of different GPUs, owner-based flags) need every GPU.
MIRROR_SCHEMES = ("tp-nvls", "sp-nvls")


def _mirror_mode(cfg: SystemConfig, scheme: str, sim: str, functional: bool) -> bool:
    """Whether to run in mirror mode; UserError (one line) if asked where it does not hold."""
    if sim not in SIM_MODES:
        raise UserError(f"sim: unknown mode '{sim}'; valid: {', '.join(SIM_MODES)}")
    if sim != "mirror":
        return False
    why = mirror_misfit(cfg, functional)
    if not why and scheme not in MIRROR_SCHEMES:
        why = f"scheme {scheme} is not one whose GPUs all run GPU 0's program ({', '.join(MIRROR_SCHEMES)})"
    if why:
        raise UserError(f"sim mirror: this run is not symmetric: {why}; use sim='full'")
    return True


def _estimate(cfg: SystemConfig, period: Period, dtype_bytes: int, sch: Scheme) -> float:
    """The period's estimated events (cais.experiments.estimates): a MoE period's with
    its exchanges as the scheme's EP kernel runs them."""
    module = getattr(sch, "module", None)
    if period.routing is not None and module is not None:
        return moe_period_events(cfg, period, dtype_bytes, module)
    return period_events(cfg, period, dtype_bytes, sch.switch)


def _check_size(cfg: SystemConfig, model: ModelSpec, sch: Scheme, mode: str, period: Period,
                mirror: bool = False, hint: str = "use a smaller batch or seq") -> None:
    """UserError (one line, ending in ``hint``) if the period is estimated beyond what
    the simulator can finish (cais.limits; mirror mode simulates one GPU's share)."""
    scheme = sch.name
    estimate = _estimate(cfg, period, model.dtype_bytes, sch) / (cfg.gpus if mirror else 1)
    check_machine(cfg, estimate)
    check_events(estimate,
                 f"{model.name} {mode} under {scheme} with batch {model.batch} and seq {model.seq} on {cfg.gpus} GPUs",
                 hint)


def check_memory(cfg: SystemConfig, model: ModelSpec, mode: str, sp: bool, keep_inputs: bool = False) -> Footprint:
    """The run's per-GPU HBM footprint (cais.workload.footprint, docs/memory.md); a
    one-line MemoryCapacityError (a UserError) if it exceeds ``gpu.hbm_capacity_GB``.
    ``keep_inputs``: every layer keeps its gathered forward inputs for the backward."""
    fp = footprint(model, cfg.gpus, mode, sp, keep_inputs)
    check_fits(fp, cfg.gpu.hbm_capacity_GB, cfg.gpu.name, f"batch {model.batch:,} and seq {model.seq:,}")
    return fp


def _keeps_inputs(sch: Scheme, cfg: SystemConfig, mode: str) -> bool:
    """Whether a training period of ``sch`` keeps its gathered forward inputs for the
    backward (``train.wgrad_inputs``; a choice the scheme cannot run is its
    WgradMismatch); False outside training."""
    return mode == "train" and sch.wgrad_plan(cfg.train).inputs.startswith("keep")


#: a layer period past this (us) is absurd for any model: a real layer takes us to ms
ABSURD_PERIOD_US = 1e6


def warnings_of(r: LayerResult) -> list[str]:
    """One line per thing a user should know the run did not do as asked: each
    setting it could not honour (what it used instead), and a period absurd for a
    layer (over a second)."""
    lines = [f"{f}: {text}" for f, text in r.adjusted.items()]
    if r.total_us > ABSURD_PERIOD_US:
        lines.append(f"the layer period is {r.total_us / 1e6:,.3g} s, over a second for one layer (real layers take "
                     "microseconds to milliseconds): a setting is far from any machine")
    return lines


def mode_notes(sch: Scheme, cfg: SystemConfig, mode: str) -> dict[str, str]:
    """What a run in ``mode`` does outside its design, field -> one line: a scheme
    used in a mode it was not made for (an inference stack's all-reduce in training),
    and training-only settings given outside training (the weight-gradient dataflow
    in a period with no backward, a MoE layer's routing in a dense layer's run)."""
    notes = {}
    if mode in MODES and mode not in sch.modes:
        notes["mode"] = (f"'{sch.name}' is {sch.modes_why}; in {mode} it runs, but as no deployment runs it "
                         f"(made for: {', '.join(sch.modes)})")
    if mode != "train":
        notes.update({f"train.{key}": f"'{getattr(cfg.train, key)}' has no effect: it sets the weight-gradient "
                                      f"dataflow, and {mode} has no backward (it applies to training only)"
                      for key in ("wgrad_inputs", "wgrad_grads") if getattr(cfg.train, key) != "scheme"})
    unset = MoeConfig()
    what = {"dispatch_dtype": "dispatch", "expert_dtype": "experts' GEMMs", "capacity_factor": "expert capacity",
            "capacity": "expert capacity"}
    notes.update({f"moe.{key}": f"'{getattr(cfg.moe, key)}' has no effect: it sets a MoE layer's "
                                f"{what.get(key, 'routing')}, and this layer is dense"
                  for key in MoeConfig.model_fields if getattr(cfg.moe, key) != getattr(unset, key)})
    return notes


def check_layer(cfg: SystemConfig, model: ModelSpec | MoeSpec, scheme: str, mode: str, sms: int | None = None,
                sim: str = "full", attention: str = "tp", expert_tp: int = 1,
                attention_tp: int | None = None) -> None:
    """Raise the UserError :func:`run_layer` would raise before simulating anything (an
    unknown scheme or mode, a bad ``sms``, a switch model the scheme cannot run on
    (``SwitchMismatch``), ``sim='mirror'`` on a run that is not symmetric, a model that
    does not split over the GPUs, a period too big to simulate, a footprint beyond the
    GPUs' HBM), without running it."""
    sch = get_scheme(scheme)
    _check_sms(cfg, sms)
    _check_family(sch, model)
    if isinstance(model, MoeSpec):
        _check_moe(cfg, model, sch, mode, sim, attention, expert_tp, attention_tp)
        return
    _check_dense_parallelism(model, expert_tp, attention_tp)
    switch = sch.switch_model(cfg.switch.model)  # a scheme on a switch without what it needs (SwitchMismatch)
    sch.vc_policy_for(cfg.link.vc_policy)  # a VC policy that undoes the scheme (VcMismatch)
    keep = _keeps_inputs(sch, cfg, mode)  # a weight-gradient dataflow it cannot run (WgradMismatch)
    if switch != cfg.switch.model:
        cfg = cfg.with_overrides(switch={**cfg.switch.model_dump(), "model": switch})
    mirror = _mirror_mode(cfg, scheme, sim, False)
    _check_size(cfg, model, sch, mode, build_period(model, cfg.gpus, mode, sch.sp), mirror)
    check_memory(cfg, model, mode, sch.sp, keep)


def run_layer(cfg: SystemConfig, model: ModelSpec | MoeSpec, scheme: str, mode: str, sms: int | None = None,
              functional: bool = False, seed: int = 0, p_drop: float = 0.1, regather: bool = True,
              recorder: Recorder | None = None, progress: RunProgress | None = None,
              sim: str = "full", attention: str = "tp", expert_tp: int = 1,
              check_hbm: bool = True, attention_tp: int | None = None) -> LayerResult:
    """Simulate one period of ``model`` under ``scheme`` on ``cfg`` (``sms`` per GPU); a
    ``recorder``, if given, records the run (each GPU's part of every segment is marked
    on its ``segments`` track). A MoE model (:class:`~cais.workload.moe.MoeSpec`) runs
    under an EP scheme (cais.schemes.ep), its attention under TP or data parallel
    (``attention``; under TP in groups of ``attention_tp`` GPUs where given) and its
    experts split ``expert_tp`` ways (cais.workload.moe_dataflow).
    ``check_hbm``: refuse a dense run whose footprint exceeds the HBM (off where the
    layer times a part of a larger run whose memory is that run's to judge)."""
    sch = get_scheme(scheme)
    _check_sms(cfg, sms)
    if sms is not None:
        cfg = cfg.with_overrides(gpu={**cfg.gpu.model_dump(), "sms": sms})
    _check_family(sch, model)
    if isinstance(model, MoeSpec):
        return _run_moe(cfg, model, sch, mode, functional, seed, p_drop, recorder, progress, sim, attention,
                        expert_tp, attention_tp)
    _check_dense_parallelism(model, expert_tp, attention_tp)
    switch = sch.switch_model(cfg.switch.model)  # auto resolved; a switch it cannot run on refused
    if switch != cfg.switch.model:
        cfg = cfg.with_overrides(switch={**cfg.switch.model_dump(), "model": switch})
    vc_policy = sch.vc_policy_for(cfg.link.vc_policy)
    keep = _keeps_inputs(sch, cfg, mode)
    if vc_policy != cfg.link.vc_policy:
        cfg = cfg.with_overrides(link={**cfg.link.model_dump(), "vc_policy": vc_policy})
    mirror = _mirror_mode(cfg, scheme, sim, functional)
    batch = model.batch  # the real sequences; a decode CUDA graph may run more
    if mode == "decode" and cfg.gpu.launch == "graph" and cfg.decode.graph_padding and graph_batch(batch) != batch:
        model = graph_padded(model, graph_batch(batch))
    period = build_period(model, cfg.gpus, mode, sch.sp, seed, regather)
    _check_size(cfg, model, sch, mode, period, mirror)
    memory = check_memory(cfg, model, mode, sch.sp, keep) if check_hbm else None
    if progress is not None:
        progress.begin(period_events(cfg, period, model.dtype_bytes, sch.switch) / (cfg.gpus if mirror else 1),
                       f"{model.name} {mode} under {scheme} on {cfg.gpus} GPUs")
    t0 = time.perf_counter()
    with fewer_collections():  # building the layer's kernels makes as many objects as running them
        m = Machine(cfg, functional=functional, recorder=recorder, progress=progress, mirror=mirror)
        case = FunctionalCase(model, period, p_drop, seed) if functional else None
        if case is not None:
            _alloc(m, period, case)
        cm = ComputeModel.for_gpu(cfg.gpu)
        run = LayerRun(m, model, period, cm, p_drop)
        sch.run(run)
        m.run()
    check_mirror(m)
    end = max((k.finished_at or 0) for _, _, k in run.kernels)
    unfinished = [name for name, _, k in run.kernels if k.finished_at is None]
    if unfinished:  # never launched: their dependencies never fired
        raise Stalled(f"scheme {scheme}: kernels never launched, their dependencies never came: "
                      f"{', '.join(sorted(set(unfinished))[:5])}")
    metrics = run_metrics(m.record(end))
    tables = metrics.merge.by_tensor_kB if metrics.merge is not None else None
    subs = {}
    for c in sorted(period.chains, key=lambda c: c.name):
        span = run.spans[c.name]
        comp, comm = chain_bound_ps(run, c)
        subs[c.name] = {"time_us": (span.end - (span.start or 0)) / PS_PER_US, "bound_us": max(comp, comm) / PS_PER_US,
                        "compute_us": comp / PS_PER_US, "comm_us": comm / PS_PER_US}
        if c.name in run.sm_splits:  # a fused pipeline's SM split: (GEMM-RS SMs, LN + AG-GEMM SMs); equal: none
            subs[c.name]["gemm_rs_sms"], subs[c.name]["ag_gemm_sms"] = map(float, run.sm_splits[c.name])
        if tables is not None:  # the table its reductions and gathered loads needed (any later reader's too)
            subs[c.name]["table_peak_kB"] = max(tables.get(c.reduced, 0.0), tables.get(c.gather_src, 0.0))
    segs = {name: (sp.end - (sp.start or 0)) / PS_PER_US for name, sp in run.spans.items()}
    if m.recorder is not None:
        _mark_segments(run)
    bad, checked = _check(m, case) if case is not None else ([], 0)
    return LayerResult(
        model=model.name, scheme=scheme, mode=mode, gpus=cfg.gpus, sms=cfg.gpu.sms, total_us=end / PS_PER_US,
        sublayers=subs, segments=segs, metrics=mirrored(metrics, m.n) if mirror else metrics,
        events=m.sim.events, wall_s=time.perf_counter() - t0, kernel_us=kernel_split(run),
        kernel_tbs=kernel_tb_times(run), mismatches=bad,
        checked=checked, switch=cfg.switch.model, vc_policy=cfg.link.vc_policy,
        tokens=batch if mode == "decode" else period.dims.real_tokens,  # a decode graph's padding rows are padding
        padded_tokens=period.dims.tokens, sim=sim, memory=memory, hbm_capacity_GB=cfg.gpu.hbm_capacity_GB,
        collective_choice=cfg.collective.layer_choice,
        collectives_ran={f"{a}/{p}": k for (a, p), k in sorted(run.choices.items())},
        adjusted={**m.adjusted, **mode_notes(sch, cfg, mode)},
        token=token_time(cfg, cm, model, batch, cfg.gpu.sms, end / PS_PER_US, period.dims.batch)
        if mode == "decode" else None)


def _check_family(sch: Scheme, model: ModelSpec | MoeSpec) -> None:
    """A UserError (one line) for a dense scheme on a MoE model or an EP scheme on a
    dense one."""
    moe_model, moe_scheme = isinstance(model, MoeSpec), sch.family == MOE_FAMILY
    if moe_model and not moe_scheme:
        raise UserError(f"scheme: '{sch.name}' runs dense tensor-parallel layers; {model.name} is a mixture-of-experts "
                        f"model: use an EP scheme ({', '.join(moe_schemes())})")
    if moe_scheme and not moe_model:
        raise UserError(f"scheme: '{sch.name}' runs mixture-of-experts layers; {model.name} is dense: use a dense "
                        "scheme (see 'cais schemes')")


def _check_dense_parallelism(model: ModelSpec, expert_tp: int, attention_tp: int | None = None) -> None:
    """A UserError (one line) for a MoE layer's parallelism asked of a dense model."""
    if expert_tp != 1:
        raise UserError(f"expert_tp: it splits a mixture-of-experts layer's experts; {model.name} is dense (got "
                        f"{expert_tp}; allowed: 1)")
    if attention_tp is not None:
        raise UserError(f"attention_tp: it sets a mixture-of-experts layer's attention TP groups; {model.name} is "
                        f"dense, its attention under the scheme's TP over every GPU (got {attention_tp}; allowed: "
                        "none)")


def moe_period(cfg: SystemConfig, model: MoeSpec, mode: str, attention: str, seed: int, expert_tp: int = 1,
               form: str = "group", attention_tp: int | None = None) -> Period:
    """The MoE period a run of ``model`` on ``cfg`` simulates, its routing drawn as the
    system's ``moe`` settings say (:class:`cais.config.MoeConfig`: the generator, its
    seed (default: the run's ``seed``) and skew), its experts split ``expert_tp`` ways
    as the EP kernel's stack sends them (``form``: cais.workload.routing.expert_tp_routing),
    its attention under TP in groups of ``attention_tp`` GPUs where given, each GPU's
    rows to one expert bounded by ``moe.capacity_factor`` (dropped or padded as
    ``MoeConfig.capacity_mode`` says), an MLA model's attention timed as
    ``moe.mla_timing`` says (cais.workload.mla)."""
    rc = cfg.moe
    return build_moe_period(model, cfg.gpus, mode, attention, seed, rc.routing, rc.seed, expert_tp, form,
                            attention_tp, rc.capacity_factor, rc.capacity_mode(), rc.mla_timing,
                            **rc.generator_kwargs())


def _expert_tp_form(sch: Scheme, model: MoeSpec, n: int, expert_tp: int) -> str:
    """How ``sch``'s EP kernel runs ``expert_tp`` (a UserError where the plan does not
    split ``model`` over ``n`` GPUs, or no stack runs the kernel with expert TP)."""
    ep_plan(model, n, expert_tp)
    module = EP_KERNELS[getattr(sch, "kernel", "")]
    return expert_tp_form(module, expert_tp, getattr(sch, "kernel", ""))


def _check_moe(cfg: SystemConfig, model: MoeSpec, sch: Scheme, mode: str, sim: str, attention: str,
               expert_tp: int = 1, attention_tp: int | None = None) -> Period:
    """The MoE period to run; a UserError (one line) for what a MoE run cannot do."""
    if sim != "full":
        raise UserError(f"sim: a MoE layer runs every GPU ('full'); got '{sim}'")
    kernel = getattr(sch, "kernel", "")
    check_dispatch_dtype(EP_KERNELS[kernel], cfg.moe.dispatch_dtype, kernel)
    check_expert_dtype(cfg.moe.expert_dtype, cfg.moe.dispatch_dtype, mode)
    check_capacity_mode(EP_KERNELS[kernel], cfg.moe.capacity_mode(), kernel, "moe.capacity")
    attention, attention_tp = attention_plan(model, cfg.gpus, attention, attention_tp)
    form = _expert_tp_form(sch, model, cfg.gpus, expert_tp)
    period = moe_period(cfg, model, mode, attention, 0, expert_tp, form, attention_tp)
    dm = attention_model(model)
    padded = cfg.moe.capacity_mode() == "pad"  # padding rows to every expert: the factor sizes the period too
    _check_size(cfg, dm, sch, mode, period, hint="use a smaller moe.capacity_factor, batch or seq" if padded
                else "use a smaller batch or seq")
    return period


def moe_memory(cfg: SystemConfig, model: MoeSpec, mode: str, attention: str, period: Period,
               attention_tp: int | None = None) -> tuple[Footprint, str]:
    """A MoE run's per-GPU HBM footprint (cais.workload.moe_footprint, docs/memory.md
    "MoE runs"), its receive-side tensors those of the busiest GPU of ``period``'s
    routing, and the warning to give where it exceeds ``gpu.hbm_capacity_GB`` ("" where
    it fits): over capacity the MoE path warns and runs (a full-size layer's timing is
    the point of many runs), where the dense path refuses."""
    rt = period.routing
    assert rt is not None
    received = rt.expert_rows().sum(axis=0).reshape(rt.ranks, rt.per_rank).sum(axis=1)
    fp = moe_footprint(model, cfg.gpus, mode, attention, period.expert_tp, [int(r) for r in received], attention_tp,
                       cfg.moe.mla_timing)
    line = over_capacity(fp, cfg.gpu.hbm_capacity_GB, cfg.gpu.name, f"batch {model.batch:,} and seq {model.seq:,}",
                         fp.split)
    return fp, "" if line is None else f"{line.removeprefix('memory: ')} (run and timed as asked)"


def _run_moe(cfg: SystemConfig, model: MoeSpec, sch: Scheme, mode: str, functional: bool, seed: int, p_drop: float,
             recorder: Recorder | None, progress: RunProgress | None, sim: str, attention: str,
             expert_tp: int = 1, attention_tp: int | None = None) -> LayerResult:
    """:func:`run_layer` for a MoE layer: its period (cais.workload.moe_dataflow) on the
    dense path's machine, LayerRun and kernels, run by the EP scheme; in decode also the
    time per output token (:func:`moe_decode_token`)."""
    asked = cfg
    switch = sch.switch_model(cfg.switch.model)
    if switch != cfg.switch.model:
        cfg = cfg.with_overrides(switch={**cfg.switch.model_dump(), "model": switch})
    _check_moe(cfg, model, sch, mode, sim, attention, expert_tp, attention_tp)
    attention, attention_tp = attention_plan(model, cfg.gpus, attention, attention_tp)
    period = moe_period(cfg, model, mode, attention, seed, expert_tp, _expert_tp_form(sch, model, cfg.gpus, expert_tp),
                        attention_tp)
    memory, over = moe_memory(cfg, model, mode, attention, period, attention_tp)
    bad: list[str] = []
    if functional:  # the expert block's data, exactly (its attention part is the dense path's, checked there)
        assert period.routing is not None
        if expert_tp > 1 and period.routing.pad_rows.any():
            raise UserError(f"moe.capacity: functional mode does not check 'pad' with expert_tp {expert_tp} "
                            "(its expert-TP collectives' padding rows); allowed in functional mode: none, drop, or "
                            "pad at expert_tp 1")
        if not expert_block_check(cfg, getattr(sch, "kernel", ""), model, period.routing, seed, expert_tp):
            bad.append("expert_block")
    dm = attention_model(model)
    if progress is not None:
        progress.begin(_estimate(cfg, period, dm.dtype_bytes, sch),
                       f"{model.name} {mode} under {sch.name} on {cfg.gpus} GPUs")
    t0 = time.perf_counter()
    with fewer_collections():
        m = Machine(cfg, recorder=recorder, progress=progress)
        cm = ComputeModel.for_gpu(cfg.gpu)
        run = LayerRun(m, dm, period, cm, p_drop)
        sch.run(run)
        m.run()
    end = max((k.finished_at or 0) for _, _, k in run.kernels)
    unfinished = [name for name, _, k in run.kernels if k.finished_at is None]
    if unfinished:
        raise Stalled(f"scheme {sch.name}: kernels never launched, their dependencies never came: "
                      f"{', '.join(sorted(set(unfinished))[:5])}")
    metrics = run_metrics(m.record(end))
    subs = {}
    for c in period.chains:
        span = run.spans[c.name]
        comp, comm = chain_bound_ps(run, c)
        subs[c.name] = {"time_us": (span.end - (span.start or 0)) / PS_PER_US, "bound_us": max(comp, comm) / PS_PER_US,
                        "compute_us": comp / PS_PER_US, "comm_us": comm / PS_PER_US}
    segs = {name: (sp.end - (sp.start or 0)) / PS_PER_US for name, sp in run.spans.items()}
    if m.recorder is not None:
        _mark_segments(run)
    token, no_token = None, ""
    if mode == "decode":
        try:
            token = moe_decode_token(asked, cm, model, attention, seed, end / PS_PER_US, attention_tp)
        except TooBig as exc:  # the layer stands; only the per-token time's dense first layers are too big to run
            no_token = f"token_us not computed: its dense first layers' run is too big ({str(exc).split(' (')[0]})"
    return LayerResult(
        model=model.name, scheme=sch.name, mode=mode, gpus=cfg.gpus, sms=cfg.gpu.sms, total_us=end / PS_PER_US,
        sublayers=subs, segments=segs, metrics=metrics, events=m.sim.events, wall_s=time.perf_counter() - t0,
        kernel_us=kernel_split(run), kernel_tbs=kernel_tb_times(run), switch=cfg.switch.model,
        vc_policy=cfg.link.vc_policy, tokens=period.dims.real_tokens, padded_tokens=period.dims.tokens, sim=sim,
        collective_choice=cfg.collective.layer_choice,
        collectives_ran={f"{a}/{p}": k for (a, p), k in sorted(run.choices.items())},
        mismatches=bad, checked=1 if functional else 0, memory=memory, hbm_capacity_GB=cfg.gpu.hbm_capacity_GB,
        token=token,
        adjusted={**m.adjusted, **({"memory": over} if over else {}), **({"token": no_token} if no_token else {})},
        moe={**moe_breakdown(period, segs, sch, attention), **capacity_report(cfg),
             "shared_overlap_us": _overlap_us(run, period),
             **group_tables(m), **_expert_tp_bytes(run, sch, period), **exchange_bytes(run, sch, period)})


#: the dense scheme a MoE model's dense first layers run under (:func:`dense_first_us`)
DENSE_FIRST_SCHEME = "sp-nccl"


def attention_plan(model: MoeSpec, n: int, attention: str, attention_tp: int | None) -> tuple[str, int]:
    """(attention, its TP group's GPUs) of a MoE run on ``n`` GPUs
    (cais.workload.moe_dataflow.attention_group; a UserError where they do not agree):
    a group of one is ``dp``, any larger group ``tp``, so a run given ``attention_tp`` =
    GPUs or 1 is the ``tp`` or ``dp`` run."""
    group = attention_group(model, n, attention, attention_tp)
    return ("tp" if group > 1 else "dp"), group


def dense_first_us(cfg: SystemConfig, model: MoeSpec, attention: str, seed: int = 0) -> float:
    """One decode period (us) of one of ``model``'s first ``dense_layers`` layers, simulated:
    the MoE layer's attention with the dense MLP of ``dense_ffn_hidden``
    (cais.workload.moe_dataflow.dense_layer_model), at the MoE run's KV length, under
    :data:`DENSE_FIRST_SCHEME` over every GPU of ``cfg`` (as the system was asked for,
    before an in-switch EP scheme's switch).

    The decision: every EP scheme runs its attention as Megatron-Core's TP with sequence
    parallelism, the output projection's ReduceScatter and the next QKV's AllGather
    NCCL's by size (cais.schemes.ep); ``sp-nccl`` is that dense layer, so the dense
    layers pay the collectives the MoE layers' attention pays. Attention under TP: the
    MoE run's ``batch`` sequences over the GPUs. Attention data parallel (``dp``):
    the simulator has no TP-1 dense layer (a system has 2 GPUs or more), so the dense
    layers run TP over every GPU with the data-parallel ranks' sequences together
    (GPUs x ``batch``), as SGLang runs a dense MLP under DP attention by default (the
    tokens gathered to the full TP group; its ``moe_dense_tp_size``); their attention
    then runs TP too, where SGLang keeps it data parallel (docs/moe.md). Attention in
    TP groups: likewise, the groups' sequences together (:func:`moe_decode_token` passes
    them as the batch of a ``tp`` run). Where the dense layer does not split over every
    GPU (DeepSeek-V3's 128 heads over nvl72's 72), it runs TP over the largest group that
    it splits over and that divides the GPUs (cais.workload.moe_dataflow.dense_tp_group:
    9 groups of 8 there), the groups side by side: one group is timed, on that many GPUs
    of the system, with its share of the sequences.

    The dense layer is timed, not checked against the HBM: it is one part of the MoE
    model, whose footprint is the MoE run's (and its attention's MHA stand-in for MLA
    would count a KV cache many times MLA's latent one). It runs the batch as given, as the
    MoE layers do (the MoE path has no CUDA-graph batch padding: ``decode.graph_padding``
    is for dense models)."""
    batch = model.batch if attention == "tp" else model.batch * cfg.gpus
    group = dense_tp_group(model, cfg.gpus)
    if group < cfg.gpus:  # one of the dense layers' TP groups, with its share of the sequences
        batch, cfg = max(1, batch * group // cfg.gpus), cfg.with_overrides(gpus=group)
    exact = cfg.with_overrides(decode={**cfg.decode.model_dump(), "graph_padding": False})
    r = run_layer(exact, dense_layer_model(model, batch), DENSE_FIRST_SCHEME, "decode", seed=seed,
                  check_hbm=False)
    return r.total_us


def moe_decode_token(cfg: SystemConfig, cm: ComputeModel, model: MoeSpec, attention: str, seed: int,
                     layer_us: float, attention_tp: int | None = None) -> TokenTime:
    """A MoE model's decode time per output token (experiments/token.py): its MoE layers
    at ``layer_us``, its dense first layers at :func:`dense_first_us` (none run where
    ``dense_layers`` is 0), and the tail with the model's hidden and vocabulary, its
    lm_head split over the attention's TP group (every GPU under ``tp``; each group's
    ``attention_tp`` GPUs under TP groups, its tail's collectives within it; each GPU
    its own whole vocabulary and batch under ``dp``, no logits gather)."""
    tp = attention_plan(model, cfg.gpus, attention, attention_tp)[1]
    dense_model, dense_attention = model, attention
    if 1 < tp < cfg.gpus:  # the groups' sequences together, TP over every GPU (as under dp: dense_first_us)
        dense_model, dense_attention = model.model_copy(update={"batch": model.batch * (cfg.gpus // tp)}), "tp"
    dense_us = dense_first_us(cfg, dense_model, dense_attention, seed) if model.dense_layers else 0.0
    batch = model.batch  # per attention group: tp, the sequences over the GPUs; dp, one GPU's own
    return moe_token_time(cfg, cm, attention_model(model), model.moe_layers, batch, cfg.gpu.sms, layer_us, tp,
                          model.dense_layers, dense_us, DENSE_FIRST_SCHEME if model.dense_layers else "")


def capacity_report(cfg: SystemConfig) -> dict[str, object]:
    """The capacity a MoE run's routing ran (``MoeConfig.capacity_mode``: ``none``,
    ``drop`` or ``pad``) and its ``moe.capacity_factor`` (None: no limit)."""
    return {"capacity": cfg.moe.capacity_mode(), "capacity_factor": cfg.moe.capacity_factor}


def _expert_tp_bytes(run: LayerRun, sch: Scheme, period: Period) -> dict[str, int]:
    """The payload bytes one GPU's expert-TP collectives send (a ring AllGather or
    ReduceScatter of ``count`` elements over ``expert_tp`` GPUs: ``(expert_tp - 1) /
    expert_tp`` of it; 0 where the kernel's exchange does it or at expert TP 1)."""
    tp, total = period.expert_tp, 0
    spec_of = getattr(sch, "expert_tp_spec", None)
    for seg in period.segments:
        if isinstance(seg, MoeStep) and seg.kind == "expert_tp" and spec_of is not None:
            spec = spec_of(run, seg)
            if spec is not None:
                total += (tp - 1) * (spec.count // tp) * spec.elem_bytes
    return {"expert_tp_bytes": total}


def check_expert_dtype(expert_dtype: str, dispatch_dtype: str, mode: str) -> None:
    """A UserError (one line, naming ``moe.expert_dtype``) where FP8 experts cannot run:
    in training (the backward's GEMMs and FP8 training recipes are not modelled) or
    behind a BF16 dispatch (the stacks that run DeepGEMM's FP8 grouped GEMMs, SGLang's
    and vLLM's DeepEP paths, dispatch the rows already quantized; a BF16 dispatch would
    need a quantizing pass this path does not run)."""
    if expert_dtype != "fp8":
        return
    if mode == "train":
        raise UserError("moe.expert_dtype: 'fp8' runs in prefill and decode; training's experts are bf16 here "
                        "(allowed in train: bf16)")
    if dispatch_dtype != "fp8":
        raise UserError(f"moe.expert_dtype: 'fp8' needs moe.dispatch_dtype=fp8 (the rows arrive quantized, as "
                        f"DeepEP's FP8 dispatch sends them); got moe.dispatch_dtype={dispatch_dtype}")


def exchange_bytes(run: LayerRun, sch: Scheme, period: Period) -> dict[str, object]:
    """The forward dispatch's dtype (``moe.dispatch_dtype``) and the payload bytes GPU 0
    sends to other GPUs in the period's dispatches (the forward's, and in training the
    combine's backward) and combines (the combine, and the dispatch's backward), each
    call counted as ``cais ep`` counts it (cais.experiments.ep ``own_bytes``: FP8 rows
    with their scales)."""
    rt, kernel = period.routing, getattr(sch, "kernel", "")
    call_of = getattr(sch, "exchange_call", None)
    out: dict[str, object] = {"dispatch_dtype": run.m.cfg.moe.dispatch_dtype, "dispatch_bytes": 0, "combine_bytes": 0,
                              "expert_dtype": run.m.cfg.moe.expert_dtype}
    if rt is None or call_of is None:
        return out
    for seg in period.segments:
        if isinstance(seg, MoeStep) and seg.kind == "exchange":
            key = f"{seg.kernel}_bytes"
            out[key] = int(out[key]) + own_bytes(kernel, call_of(run, seg, rt))  # type: ignore[call-overload]
    return out


def group_tables(m: Machine) -> dict[str, int]:
    """The dynamic multicast group tables' telemetry of a run (hw/ep_switch.py; zeros on
    a switch without them): the busiest port's peak entries, and the binds and the
    refused binds (overflows) over every port of every chip."""
    peak = binds = overflows = 0
    for sw in m.fabric.switches:
        stats = getattr(sw, "group_stats", None)
        if stats is not None:
            st = stats()
            peak, binds, overflows = max(peak, st.peak), binds + st.binds, overflows + st.overflows
    return {"group_table_peak": peak, "group_table_binds": binds, "group_table_overflows": overflows}


def _overlap_us(run: LayerRun, period: Period) -> float:
    """How long (us) the forward shared experts ran beside the forward dispatch (the
    intersection of their spans over the GPUs; 0 without shared experts)."""
    side = [run.spans[s.name] for s in period.segments if getattr(s, "side", False) and s.name in run.spans
            and not s.name.endswith(("_dgrad", "_wgrad", "_bwd"))]
    disp = run.spans.get("dispatch")
    if not side or disp is None or disp.start is None:
        return 0.0
    start = min(sp.start for sp in side if sp.start is not None)
    end = max(sp.end for sp in side)
    return max(0, min(end, disp.end) - max(start, disp.start)) / PS_PER_US


def moe_breakdown(period: Period, segs: dict[str, float], sch: Scheme, attention: str) -> dict[str, object]:
    """A MoE layer's expert block: the EP kernel, how attention ran (``attention_tp``:
    its TP group's GPUs; ``mla``: whether MLA's own ops ran, ``moe.mla_timing``), the EP
    degree and expert TP, the tokens each GPU routes (the model's experts and top-k), the time
    (us, first kernel start to last end over the GPUs) of its dispatches and combines
    (the backward's included: a combine's backward is a dispatch), of its grouped GEMMs,
    of its fused blocks (an in-switch kernel's dispatch, experts and combine in one
    kernel: ``fused_us``; its dispatch and combine are then 0), of the shared experts
    and of the expert-TP collectives (``expert_tp_us``), and the routing's send matrices
    (over the GPUs; at expert TP > 1 over the (expert, slot) pairs the kernel sends)
    with their imbalance (busiest endpoint over the mean): one row per (token,
    destination rank) and per (token, expert), the (token, expert) selections capacity
    dropped (``dropped``) and the padding rows it added (``padded_rows``, over every
    GPU; in the ``all`` expert-TP form counted once, not once per slot)."""
    rt = period.routing
    assert rt is not None
    steps = [s for s in period.segments if isinstance(s, MoeStep)]

    def total(names: list[str]) -> float:
        return sum(segs.get(name, 0.0) for name in names)
    per_rank, per_expert = rt.matrix("rank"), rt.matrix("expert")
    received = rt.expert_rows().sum(axis=0).reshape(rt.ranks, rt.per_rank).sum(axis=1)
    tp = period.expert_tp
    slots = tp if tp > 1 and expert_tp_form(EP_KERNELS[getattr(sch, "kernel", "")], tp) == "all" else 1
    return {"kernel": getattr(sch, "kernel", ""), "attention": attention, "attention_tp": period.attention_tp,
            "mla": period.mla is not None, "ep": rt.ranks // tp, "expert_tp": tp,
            "routing": rt.source,
            "tokens_per_rank": rt.tokens, "experts": rt.experts // tp, "topk": rt.topk // slots,
            "dispatch_us": total([s.name for s in steps if s.kind == "exchange" and s.kernel == "dispatch"]),
            "combine_us": total([s.name for s in steps if s.kind == "exchange" and s.kernel == "combine"]),
            "grouped_gemm_us": total([s.name for s in steps if s.kind == "grouped_gemm"]),
            "expert_tp_us": total([s.name for s in steps if s.kind == "expert_tp"]),
            "fused_us": total([name for name in segs if FUSED_MARK in name]),
            "shared_us": total([s.name for s in period.segments if getattr(s, "side", False)]),
            "received_rows": received.tolist(),
            "send_matrix_rank": per_rank.tolist(), "imbalance_rank": imbalance(per_rank),
            "send_matrix_expert": per_expert.tolist(), "imbalance_expert": imbalance(per_expert),
            "dropped": rt.dropped() // slots,
            "padded_rows": (int(rt.pad_rows.sum()) if rt.pad_rows.size else 0) // slots}


def _mark_segments(run: LayerRun) -> None:
    """Mark each GPU's part of every segment: its first kernel start to last kernel end."""
    spans: dict[tuple[int, str], tuple[int, int]] = {}
    for segment, g, k in run.kernels:
        if k.started_at is None or k.finished_at is None or segment not in run.spans:
            continue
        s, e = spans.get((g, segment), (k.started_at, k.finished_at))
        spans[(g, segment)] = (min(s, k.started_at), max(e, k.finished_at))
    for (g, segment), (s, e) in sorted(spans.items(), key=lambda kv: (kv[0][0], kv[1][0])):
        run.m.mark(g, "segments", segment, s, e)


def kernel_tb_times(run: LayerRun) -> dict[str, dict[str, float]]:
    """GPU 0's kernels by name: the SM time (us) their TBs held SMs, and the part of it
    they spent waiting for data, flags or TB-group syncs (``Kernel.tb_wait_ps``)."""
    out: dict[str, dict[str, float]] = {}
    for _, g, k in run.kernels:
        if g == 0 and k.finished_at is not None:
            row = out.setdefault(k.name, {"tb_us": 0.0, "tb_wait_us": 0.0})
            row["tb_us"] += k.tb_ps / PS_PER_US
            row["tb_wait_us"] += k.tb_wait_ps / PS_PER_US
    return out


def kernel_split(run: LayerRun) -> dict[str, float]:
    """GPU 0's kernel time (us) in collective kernels and in all other kernels, summed
    (overlapping kernels both count): the communication / computation split of
    the paper's Fig. 2 for bulk-synchronous schemes."""
    out = {"communication": 0.0, "computation": 0.0}
    for _, g, k in run.kernels:
        if g == 0 and k.finished_at is not None and k.started_at is not None:
            out["communication" if k.role == "communication" else "computation"] += \
                (k.finished_at - k.started_at) / PS_PER_US
    return out
