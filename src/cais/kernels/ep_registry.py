"""The expert-parallel (EP) kernels by name: the one registry ``cais ep``, the MoE
layer's EP schemes (``ep-<name>``, cais.schemes.ep) and the MoE experiment read.

The contract a kernel module keeps to be run in a MoE layer (docs/moe.md, "Adding an
EP kernel"):

* ``kernels(m: Machine, call: EpCall) -> list[Kernel]``: one kernel per GPU for the
  dispatch or combine ``call`` describes (its routing, row width, dtype), reading and
  writing the buffers it allocates itself;
* optional ``PERMUTE``: where the stack puts the token rows in expert order, ``sender``
  (before the dispatch, one row per (token, expert): Megatron's permute), ``receiver``
  (after it, the rows a rank received; the default) or ``none`` (the kernel writes the
  experts' layout itself);
* optional ``SHARED_OVERLAP``: whether the stacks that run it overlap the shared
  experts with the dispatch on a side stream (default False);
* optional ``EXPERT_TP``: how the stack that runs it runs expert TP > 1
  (cais.workload.routing ``EXPERT_TP_FORMS``: ``group`` or ``all``); absent, the kernel
  runs expert TP 1 only (no stack runs it with expert TP);
* optional ``DISPATCH_DTYPES``: the dtypes its stack dispatches a MoE layer's tokens in
  (``cais.kernels.ep_common.EP_DTYPES``; default ``("bf16",)``: the model's dtype, as
  Megatron-Core's dispatchers send it). Its combine and a training step's backward
  exchanges run BF16 whatever this says;
* optional ``CAPACITY_PAD``: where the stack running it pads each expert's input to
  capacity (capacity ``pad``: Megatron-Core's ``moe_pad_expert_input_to_capacity``):
  ``exchanged`` (before the exchange, per (source rank, expert): the padding rows are
  sent like real ones) or ``local`` (after it: rows the experts compute, nothing
  sent); absent, no stack pads its input and capacity ``pad`` is refused.
"""

from __future__ import annotations

from typing import Protocol

from cais.config import SystemConfig
from cais.errors import UserError
from cais.hw.gpu import Kernel
from cais.hw.switches import switch_model
from cais.kernels import ep_allgather, ep_deepep, ep_deepep_ll, ep_nccl, ep_switch
from cais.kernels.ep_common import EP_DTYPES, EpCall
from cais.machine import Machine
from cais.workload.routing import CAPACITY_MODES, EXPERT_TP_FORMS


class EpKernels(Protocol):
    """What an EP kernel is to the registry: a module (or an object, as the in-switch
    family's members are) whose ``kernels`` builds one kernel per GPU for a call."""

    def kernels(self, m: Machine, call: EpCall) -> list[Kernel]: ...


#: every EP kernel, by its ``--kernel`` name (the in-switch family: kernels/ep_switch.py)
EP_KERNELS: dict[str, EpKernels] = {"nccl": ep_nccl, "allgather": ep_allgather, "deepep": ep_deepep,
                                    "deepep-ll": ep_deepep_ll, **ep_switch.VARIANTS}

PERMUTE_PLACES = ("sender", "receiver", "none")


def _name(module: EpKernels) -> str:
    return str(getattr(module, "__name__", None) or getattr(module, "name", module))


def permute_place(module: EpKernels) -> str:
    """Where the stack running ``module`` permutes the token rows (module doc)."""
    place = getattr(module, "PERMUTE", "receiver")
    if place not in PERMUTE_PLACES:
        raise ValueError(f"{_name(module)}.PERMUTE: '{place}'; valid: {', '.join(PERMUTE_PLACES)}")
    return str(place)


def shipped(module: EpKernels) -> bool:
    """Whether ``module`` is a kernel a production stack runs today (False for a design
    this project proposes, such as the in-switch family: its ``proposed``)."""
    return not getattr(module, "proposed", False)


def switch_of(module: EpKernels) -> str:
    """The switch model ``module`` needs (its ``switch``; default ``nvls``: unicast and
    NVLS only)."""
    return str(getattr(module, "switch", "nvls"))


def on_switch(cfg: SystemConfig, module: EpKernels) -> SystemConfig:
    """``cfg`` on the switch model ``module`` needs: ``auto`` resolves to it; a model that
    lacks what it needs is a UserError naming ``switch.model``."""
    need, have = switch_of(module), cfg.switch.model
    if have == "auto":
        return cfg if need == "nvls" else cfg.with_overrides(switch={**cfg.switch.model_dump(), "model": need})
    if not issubclass(switch_model(have), switch_model(need)):
        raise UserError(f"switch.model: EP kernel '{_name(module)}' needs a '{need}' switch ({switch_model(need).has}); "
                        f"'{have}' has {switch_model(have).has} only; use auto or {need}")
    return cfg


def shared_overlap(module: EpKernels) -> bool:
    """Whether the stacks running ``module`` overlap the shared experts with its dispatch."""
    return bool(getattr(module, "SHARED_OVERLAP", False))


def dispatch_dtypes(module: EpKernels) -> tuple[str, ...]:
    """The dtypes the stack running ``module`` dispatches in (its ``DISPATCH_DTYPES``;
    default BF16 only)."""
    dtypes = tuple(getattr(module, "DISPATCH_DTYPES", ("bf16",)))
    bad = [d for d in dtypes if d not in EP_DTYPES]
    if bad:
        raise ValueError(f"{_name(module)}.DISPATCH_DTYPES: {bad}; valid: {', '.join(EP_DTYPES)}")
    return dtypes


def check_dispatch_dtype(module: EpKernels, dtype: str, name: str = "") -> str:
    """``dtype`` if the stack running ``module`` dispatches in it; else a UserError (one
    line, naming ``moe.dispatch_dtype`` and the kernels that take it)."""
    if dtype not in EP_DTYPES:
        raise UserError(f"moe.dispatch_dtype: unknown '{dtype}'; valid: {', '.join(EP_DTYPES)}")
    if dtype in dispatch_dtypes(module):
        return dtype
    ok = [k for k, mod in EP_KERNELS.items() if dtype in dispatch_dtypes(mod)]
    raise UserError(f"moe.dispatch_dtype: EP kernel '{name or _name(module)}' dispatches "
                    f"{', '.join(dispatch_dtypes(module))} only (its stack sends the model's dtype); {dtype} "
                    f"runs with {', '.join(ok)}")


def expert_tp_form(module: EpKernels, expert_tp: int, name: str = "") -> str:
    """How the stack running ``module`` runs ``expert_tp`` (its ``EXPERT_TP``; ``group``
    at expert TP 1, where the forms agree); a UserError (one line, naming ``expert_tp``
    and the kernels that run it) where no stack runs the kernel with expert TP."""
    form = getattr(module, "EXPERT_TP", None)
    if form is not None and form not in EXPERT_TP_FORMS:
        raise ValueError(f"{_name(module)}.EXPERT_TP: '{form}'; valid: {', '.join(EXPERT_TP_FORMS)}")
    if expert_tp == 1:
        return str(form or "group")
    if form is None:
        ok = [k for k, mod in EP_KERNELS.items() if getattr(mod, "EXPERT_TP", None)]
        raise UserError(f"expert_tp: EP kernel '{name or _name(module)}' runs expert_tp 1 only (no stack runs it with "
                        f"expert TP); expert_tp {expert_tp} runs with {', '.join(ok)}")
    return str(form)


#: where a stack pads its experts' input to capacity (``CAPACITY_PAD``, module doc)
CAPACITY_PAD_PLACES = ("exchanged", "local")


def capacity_pad(module: EpKernels) -> str | None:
    """Where the stack running ``module`` pads each expert's input to capacity (its
    ``CAPACITY_PAD``); None where no stack pads it."""
    place = getattr(module, "CAPACITY_PAD", None)
    if place is not None and place not in CAPACITY_PAD_PLACES:
        raise ValueError(f"{_name(module)}.CAPACITY_PAD: '{place}'; valid: {', '.join(CAPACITY_PAD_PLACES)}")
    return None if place is None else str(place)


def check_capacity(module: EpKernels, capacity: str, name: str = "", key: str = "capacity") -> str:
    """``capacity`` if the stack running ``module`` takes it (``none`` and ``drop``: every
    kernel; ``pad``: those with a ``CAPACITY_PAD``); else a UserError (one line, naming
    ``key``, the setting that asked for it, and the kernels that take it)."""
    if capacity not in CAPACITY_MODES:
        raise UserError(f"{key}: unknown '{capacity}'; valid: {', '.join(CAPACITY_MODES)}")
    if capacity != "pad" or capacity_pad(module) is not None:
        return capacity
    ok = [k for k, mod in EP_KERNELS.items() if capacity_pad(mod) is not None]
    raise UserError(f"{key}: EP kernel '{name or _name(module)}' has no capacity padding (its stack does not pad "
                    f"the experts' input); 'pad' runs with {', '.join(ok)}; use drop or none")
