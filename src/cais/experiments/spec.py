"""One description of a run, whoever starts it.

The command line (``cais run``, ``cais collective``), a sweep point (``cais sweep``)
and a reproduction point (``cais reproduce``) each describe what to simulate as one of
these specs and hand it over: :meth:`LayerSpec.build` / :meth:`CollectiveRunSpec.build`
check it and make the system (and the workload), ``check`` also refuses a run that
cannot fit, ``run`` simulates it. A spec is plain data, the values its user wrote;
nothing is simulated or read from disk until ``build``.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cais.experiments.collective import CollectiveResult, check_collective, resolve_choice, run_collective
from cais.errors import looks_like_path, validation_message
from cais.experiments.ep import EP_KERNELS, EpResult, check_ep_size, run_ep
from cais.experiments.ep_table import table_need
from cais.kernels.ep_registry import shipped
from cais.experiments.layer import LayerResult, check_layer, run_layer
from cais.config import ConfigError, MoeConfig, SystemConfig, apply_overrides, check_gpus, load_system, overridden
from cais.progress import RunProgress
from cais.provenance import collect
from cais.results.recorder import Recorder
from cais.schemes import get_scheme
from cais.units import SizeError, parse_size
from cais.workload.models import ModelError, ModelSpec, list_models, load_model
from cais.workload.moe import MoeSpec, is_moe_model, list_moe_models, load_moe_model
from cais.workload.routing import Routing, generate


@dataclass(frozen=True)
class SystemSpec:
    """The system a run simulates: a preset or system JSON file, how many of its GPUs
    take part, the transfer unit of a collective, and dotted config overrides as the
    user wrote them (``link.bandwidth_GBps`` -> ``"50"``), applied last. ``sets`` may
    also be given as a dict, and a value as a number (or any JSON value): it is kept
    as (key, text) pairs, a value that is not text written as JSON
    (``sets={"link.bandwidth_GBps": 50}`` is ``(("link.bandwidth_GBps", "50"),)``).

    ``set_label`` and ``gpus_label`` are how a refusal names the overrides, in the
    user's words (a sweep spec's ``set.*`` keys, the command line's flags). With
    ``gpus_after_sets`` the overrides apply to the system as it is and ``gpus`` then
    resizes it, a uniform per-GPU compute slowdown spreading to every GPU (how a
    reproduction point scales a system an override slowed down)."""

    name: str = "dgx-h100"
    gpus: int | None = None
    sets: tuple[tuple[str, str], ...] = ()
    unit: int | None = None
    set_label: str = "sets"
    gpus_label: str = "sets gpus="
    gpus_after_sets: bool = False

    def __post_init__(self) -> None:
        pairs = self.sets.items() if isinstance(self.sets, dict) else self.sets
        object.__setattr__(self, "sets", tuple((str(k), v if isinstance(v, str) else json.dumps(v))
                                               for k, v in pairs))

    def build(self) -> tuple[SystemConfig, dict[str, Any]]:
        """The system config and the values the overrides set (ConfigError, one line)."""
        if self.gpus_after_sets:
            cfg = load_system(self.name)
            if self.sets:
                cfg = apply_overrides(cfg, dict(self.sets))
            return _resized(cfg, self.gpus), {}
        cfg = load_system(self.name)
        if self.gpus is not None:
            check_gpus(cfg, self.gpus)  # more GPUs than a system that does not scale has: "gpus 16: ..."
            cfg = _option(cfg, "gpus", self.gpus, gpus=self.gpus)
        if self.unit is not None:
            cfg = _option(cfg, "unit", self.unit, transfer_unit_bytes=self.unit, collective_unit_bytes=self.unit)
        return overridden(cfg, dict(self.sets), self.set_label, self.gpus_label)


def _option(cfg: SystemConfig, option: str, value: int, **fields: int) -> SystemConfig:
    """``cfg`` with the config ``fields`` one run option sets (``gpus``; ``unit``: both
    transfer units); a value they refuse is a ConfigError (one line) that starts with
    the option's name, as the user gave it (the command shows it as ``--gpus``,
    ``--unit``), then the field and what it allows."""
    try:
        return cfg.with_overrides(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = validation_message(err)
        raise ConfigError(f"{option}: {value:,} is refused" + (f" as {where}: " if where else ": ") + msg
                          + f" (on {cfg.name})") from None


def _resized(cfg: SystemConfig, gpus: int | None) -> SystemConfig:
    """``cfg`` with ``gpus`` GPUs; a slowdown every GPU had (one value) stays on every GPU."""
    if not gpus or gpus == cfg.gpus:
        return cfg
    slow = set(cfg.gpu_slowdown.values())
    factor = slow.pop() if len(slow) == 1 and len(cfg.gpu_slowdown) == cfg.gpus else None
    data = cfg.model_dump()
    data.update(gpus=gpus, gpu_slowdown={g: factor for g in range(gpus)} if factor else {})
    return SystemConfig(**data)


@dataclass(frozen=True)
class LayerSpec:
    """One layer period to simulate (``cais run``): the model (a preset, a model JSON or
    a Hugging Face config) with its run shape and any changed dimensions, the scheme,
    the mode, the system, the SMs per GPU, and full or mirror simulation."""

    model: str
    scheme: str
    mode: str
    system: SystemSpec = field(default_factory=SystemSpec)
    sms: int | None = None
    batch: int | None = None
    seq: int | None = None
    shape: tuple[tuple[str, int], ...] = ()  # model fields replaced (hidden, ffn_hidden, heads, kv_heads)
    sim: str = "full"
    attention: str = "tp"  # a MoE layer's attention: tensor parallel or data parallel (cais.workload.moe_dataflow)
    expert_tp: int = 1  # a MoE layer's expert tensor parallelism (EP over the GPUs / expert_tp; moe_dataflow)
    attention_tp: int | None = None  # a MoE layer's attention TP group's GPUs (None: from attention; moe_dataflow)

    def workload(self) -> ModelSpec | MoeSpec:
        """The model with this run's shape (ModelError, one line): a MoE model (a MoE
        preset or config, cais.workload.moe) or a dense one."""
        if is_moe_model(self.model):
            run = {k: v for k, v in (("batch", self.batch), ("seq", self.seq)) if v}
            return load_moe_model(self.model, **dict(self.shape), **run)
        if not looks_like_path(self.model) and not Path(self.model).exists() and self.model not in list_models():
            raise ModelError(f"model: unknown model '{self.model}'; valid: {', '.join(list_models())}; MoE: "
                             f"{', '.join(list_moe_models())} (or a model JSON or Hugging Face config.json file)")
        model = load_model(self.model, **dict(self.shape))
        return model.with_run(self.batch, self.seq) if self.batch or self.seq else model

    def build(self) -> tuple[SystemConfig, dict[str, Any], ModelSpec | MoeSpec]:
        """The system, the values its overrides set, and the model."""
        cfg, overrides = self.system.build()
        return cfg, overrides, self.workload()

    def check(self, built: tuple[SystemConfig, dict[str, Any], ModelSpec | MoeSpec] | None = None) -> None:
        """Everything :meth:`run` would refuse, without simulating (UserError); on
        ``built``, if the caller built it already."""
        cfg, _, model = built or self.build()
        check_layer(cfg, model, self.scheme, self.mode, self.sms, self.sim, self.attention, self.expert_tp,
                    self.attention_tp)

    def same_run_as(self, built: tuple[SystemConfig, dict[str, Any], ModelSpec | MoeSpec] | None = None) -> str:
        """The scheme whose run of this period is this one's, event for event
        (:meth:`cais.schemes.base.Scheme.same_run_as`): its own, or ``tp-nvls`` for a
        production all-reduce kernel that hands the period's every AllReduce to NCCL."""
        cfg, _, model = built or self.build()
        if isinstance(model, MoeSpec):
            return self.scheme
        return get_scheme(self.scheme).same_run_as(model, cfg.gpus, self.mode)

    def run(self, built: tuple[SystemConfig, dict[str, Any], ModelSpec | MoeSpec] | None = None,
            recorder: Recorder | None = None, progress: RunProgress | None = None,
            functional: bool = False, seed: int = 0) -> LayerResult:
        """Simulate the period (on ``built``, if the caller built it already); the
        result carries its provenance (:func:`_stamped`)."""
        cfg, overrides, model = built or self.build()
        return _stamped(run_layer(cfg, model, self.scheme, self.mode, self.sms, functional=functional, seed=seed,
                                  recorder=recorder, progress=progress, sim=self.sim, attention=self.attention,
                                  expert_tp=self.expert_tp, attention_tp=self.attention_tp), self, cfg, overrides)


def ep_kernels(shipped_only: bool = False) -> tuple[str, ...]:
    """The EP kernels by name, in the registry's order (cais.kernels.ep_registry); with
    ``shipped_only``, those production stacks run today (no proposed design)."""
    return tuple(k for k, mod in EP_KERNELS.items() if not shipped_only or shipped(mod))


@dataclass(frozen=True)
class EpRunSpec:
    """One expert-parallel dispatch or combine to simulate (``cais ep``'s run, uniform
    routing from ``seed``): the kernel, the op, tokens per rank, the row width, top-k,
    the experts, the dtype, and the system (its GPUs are the EP ranks)."""

    kernel: str
    op: str
    tokens: int
    hidden: int
    topk: int
    experts: int
    dtype: str = "bf16"
    system: SystemSpec = field(default_factory=SystemSpec)
    seed: int = 0

    def build(self) -> tuple[SystemConfig, dict[str, Any]]:
        """The system and the values its overrides set."""
        return self.system.build()

    def routing(self, built: tuple[SystemConfig, dict[str, Any]] | None = None) -> Routing:
        """The routing the op runs on (uniform from ``seed``): the same for every op and
        kernel of one (system, tokens, top-k, experts, seed)."""
        cfg, _ = built or self.build()
        check_ep_size(cfg, self.tokens, self.topk)
        return generate("uniform", cfg.gpus, self.tokens, self.experts, self.topk, self.seed)

    def run(self, built: tuple[SystemConfig, dict[str, Any]] | None = None, drawn: Routing | None = None) -> EpResult:
        """Simulate the op (on ``built``, if the caller built it already; on ``drawn``,
        :meth:`routing`'s result, if the caller drew it already)."""
        cfg, _ = built or self.build()
        return run_ep(cfg, self.kernel, self.op, self.tokens, self.hidden, self.topk, self.experts, self.dtype,
                      seed=self.seed, drawn=drawn)


@dataclass(frozen=True)
class GroupTableNeedSpec:
    """The dynamic multicast group table (``st.mc.dyn``'s, hw/ep_switch.py) one EP call
    of a MoE model needs, entries bound for the call (cais.experiments.ep_table): the
    busiest sender port's distinct remote destination sets at the ``q``-th percentile
    over ``seeds`` routings of ``tokens`` per rank on ``ranks`` EP ranks, drawn with the
    model's experts, top-k and group limit, by ``routing`` with its skew (the defaults
    are the system's ``moe`` section's, as a layer run draws it)."""

    model: str
    ranks: int
    tokens: int
    routing: str = "uniform"
    seeds: int = 10
    alpha: float = MoeConfig().alpha
    sigma: float = MoeConfig().sigma
    q: float = 99.0

    def run(self) -> dict[str, Any]:
        """The need (:func:`cais.experiments.ep_table.table_need`'s row for the call)."""
        moe = load_moe_model(self.model)
        return table_need(self.routing, self.ranks, self.tokens, moe.experts, moe.topk, self.seeds, alpha=self.alpha,
                          sigma=self.sigma, q=self.q, n_group=moe.n_group, topk_group=moe.topk_group,
                          lifetimes=("call",))[0]


@dataclass(frozen=True)
class CollectiveRunSpec:
    """One collective to simulate (``cais collective``): the operation, the algorithm
    and protocol (either may be ``auto``: NCCL's choice by size), the buffer size in
    bytes (nccl-tests' size: a whole number, or text with a binary unit such as
    ``"16M"``, read as ``--bytes`` is, :func:`cais.units.parse_size`), the system, and
    full or mirror simulation."""

    op: str
    algo: str
    nbytes: int | str
    system: SystemSpec = field(default_factory=SystemSpec)
    protocol: str = "simple"
    sim: str = "full"

    def build(self) -> tuple[SystemConfig, dict[str, Any]]:
        """The system and the values its overrides set."""
        return self.system.build()

    def size(self) -> int:
        """The buffer size in bytes (``nbytes`` read by :func:`cais.units.parse_size`;
        a SizeError, one line naming ``nbytes``, if it is not a size)."""
        try:
            return parse_size(self.nbytes)
        except SizeError as exc:
            raise SizeError(f"nbytes: {exc}") from None

    def check(self, built: tuple[SystemConfig, dict[str, Any]] | None = None) -> None:
        """Everything :meth:`run` would refuse about the size, without simulating; on
        ``built``, if the caller built it already."""
        cfg, _ = built or self.build()
        nbytes = self.size()
        algo, _, _ = resolve_choice(cfg, self.op, self.algo, self.protocol, nbytes)
        check_collective(cfg, self.op, algo, nbytes, mirror=self.sim == "mirror")

    def run(self, built: tuple[SystemConfig, dict[str, Any]] | None = None, recorder: Recorder | None = None,
            progress: RunProgress | None = None, functional: bool = False) -> CollectiveResult:
        """Simulate the collective (on ``built``, if the caller built it already); the
        result carries its provenance (:func:`_stamped`)."""
        cfg, overrides = built or self.build()
        return _stamped(run_collective(cfg, self.op, self.algo, self.size(), functional=functional, recorder=recorder,
                                       progress=progress, sim=self.sim, protocol=self.protocol), self, cfg, overrides)


def _stamped(result: Any, spec: LayerSpec | CollectiveRunSpec, cfg: SystemConfig, overrides: dict[str, Any]) -> Any:
    """``result`` with its provenance: this package's version and commit, the date, the
    spec as the command (``python: LayerSpec(...).run()``), the system's name and the
    content hash of its configuration after the overrides, and the overrides; the
    same ``system_sha256`` as ``cais run --json`` and a sweep row of the same run."""
    return replace(result, provenance=collect(f"python: {_call(spec)}.run()", spec.system.name, cfg.model_dump(),
                                              overrides))


def _call(value: Any) -> str:
    """A spec as the call that makes it, its fields left at their defaults left out:
    ``LayerSpec(model='m', scheme='cais', mode='prefill', seq=64)``."""
    if not is_dataclass(value) or isinstance(value, type):
        return repr(value)
    args = []
    for f in fields(value):
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if getattr(value, f.name) != default:
            args.append(f"{f.name}={_call(getattr(value, f.name))}")
    return f"{type(value).__name__}({', '.join(args)})"
