"""One sweep point: a layer period (``cais run``) or a collective (``cais collective``)
given as a flat dict of run options and ``set.<dotted.config.key>`` fields.

=================  =============================================================
key                meaning (as the ``cais run`` / ``cais collective`` option)
=================  =============================================================
``kind``           ``layer`` or ``collective`` (default: ``collective`` if the
                   point has ``op``, else ``layer``)
``system``         preset or system JSON file (default ``dgx-h100``)
``gpus``           GPUs taking part (default: the system's)
``model``          layer: preset, model JSON or HF ``config.json`` (required)
``scheme``         layer: see ``cais schemes`` (required): a dense scheme, or
                   for a mixture-of-experts model an EP scheme (``ep-<kernel>``)
``mode``           layer: ``train``, ``prefill`` or ``decode`` (required)
``attention``      layer, a mixture-of-experts model: ``tp`` (default) or ``dp``
``attention_tp``   layer, a mixture-of-experts model: its attention's TP group
                   (GPUs dividing the system's; default: every GPU under ``tp``,
                   1 under ``dp``; docs/moe.md "Attention TP groups")
``expert_tp``      layer, a mixture-of-experts model: each expert's FFN split over
                   this many GPUs, EP over the rest (default 1)
``sms``            layer: SMs per GPU
``batch``/``seq``  layer: run shape (default: the model's)
``op``/``algo``    collective: ``allreduce|allgather|reducescatter``, ``ring|nvls``
``bytes``          collective: buffer size, a number or ``64K`` / ``16M`` / ``1G``
                   (binary units, :mod:`cais.units`)
``unit``           collective: transfer unit in bytes (a size, as ``bytes``)
``set.<key>``      any system config field by its dotted path, as ``--set``
                   (also written nested: ``set: {link.bandwidth_GBps: 50}``)
``tag``/``tag.*``  any value, not used by the run: labels a point (``tag.figure:
                   fig11``); part of its id and its ``point.*`` columns
=================  =============================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cais.errors import UserError

if TYPE_CHECKING:
    from cais.experiments.spec import CollectiveRunSpec, LayerSpec

COMMON_KEYS = ("kind", "system", "gpus")
LAYER_KEYS = ("model", "scheme", "mode", "sms", "batch", "seq", "attention", "attention_tp", "expert_tp")
COLLECTIVE_KEYS = ("op", "algo", "bytes", "unit")
KINDS = ("layer", "collective")
MODES = ("train", "prefill", "decode")
REQUIRED = {"layer": ("model", "scheme", "mode"), "collective": ("op", "algo", "bytes")}


def kind_of(point: Mapping[str, Any]) -> str:
    """The point's ``kind``, or the default: ``collective`` if it has ``op``, else ``layer``."""
    return str(point.get("kind", "collective" if "op" in point else "layer"))


def config_sets(point: Mapping[str, Any]) -> dict[str, str]:
    """The point's ``set.*`` fields as ``--set`` text pairs (dotted key -> text; values
    that are not text are written as JSON)."""
    pairs: dict[str, Any] = {k[4:]: v for k, v in point.items() if k.startswith("set.")}
    nested = point.get("set") or {}
    if not isinstance(nested, Mapping):
        raise UserError(f"key 'set': expected a mapping of config key: value, got {json.dumps(nested)}")
    from cais.results.table import flatten

    pairs.update(flatten({k: v for k, v in nested.items()}))
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in pairs.items()}


def parse_bytes(value: Any, key: str = "bytes") -> int:
    """A size in bytes (``bytes``, ``unit``): a positive whole number, or text like
    ``64K``, ``16M``, ``1G``, read by :func:`cais.units.parse_size` as everywhere
    (binary units; ``1GB`` is refused as ambiguous)."""
    from cais.units import parse_size

    try:
        return parse_size(value)
    except UserError as exc:
        raise UserError(f"key '{key}': {exc}") from None


def _positive(key: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise UserError(f"key '{key}': expected a positive whole number, got {json.dumps(value)}")


def _whole(key: str, value: Any) -> int | None:
    """A whole number (or None: unset); its range is the run's to check (naming what it allows)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise UserError(f"key '{key}': expected a whole number, got {json.dumps(value)}")


def _choice(key: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise UserError(f"key '{key}': unknown value {json.dumps(value)}; allowed: {', '.join(allowed)}")
    return str(value)


def prepare(point: Mapping[str, Any]) -> LayerSpec | CollectiveRunSpec:
    """Check the point's keys and values and describe its run
    (:mod:`cais.experiments.spec`); UserError (one line, naming the key and what is
    allowed) on any mistake. Reads and runs nothing: the spec's ``build`` does."""
    from cais.experiments.spec import CollectiveRunSpec, LayerSpec, SystemSpec

    kind = _choice("kind", kind_of(point), KINDS)
    allowed = (*COMMON_KEYS, *(LAYER_KEYS if kind == "layer" else COLLECTIVE_KEYS))
    for key in point:
        if key not in allowed and key not in ("set", "tag") and not key.startswith(("set.", "tag.")):
            raise UserError(f"unknown key '{key}' for kind {kind}; allowed: {', '.join(allowed)}, "
                            "set.<config key> (e.g. set.link.bandwidth_GBps), tag, tag.<name>")
    for key in REQUIRED[kind]:
        if point.get(key) is None:
            raise UserError(f"key '{key}' is required for kind {kind}")
    system = point.get("system", "dgx-h100")
    if not isinstance(system, str):
        raise UserError(f"key 'system': expected a preset name or a JSON file, got {json.dumps(system)}")
    gpus = _positive("gpus", point.get("gpus"))
    if kind == "layer":
        from cais.schemes import moe_schemes, schemes
        from cais.workload.moe_dataflow import ATTENTION_MODES

        scheme = _choice("scheme", point["scheme"], (*schemes(), *moe_schemes()))
        mode = _choice("mode", point["mode"], MODES)
        attention = _choice("attention", point.get("attention", "tp"), ATTENTION_MODES)
        if not isinstance(point["model"], str):
            raise UserError(f"key 'model': expected a preset name or a file, got {json.dumps(point['model'])}")
        sms, batch, seq = (_positive(key, point.get(key)) for key in ("sms", "batch", "seq"))
        attention_tp, expert_tp = (_whole(key, point.get(key)) for key in ("attention_tp", "expert_tp"))
        sets = tuple(config_sets(point).items())
        return LayerSpec(point["model"], scheme, mode, SystemSpec(system, gpus, sets, None, *_LABELS), sms, batch,
                         seq, attention=attention, expert_tp=1 if expert_tp is None else expert_tp,
                         attention_tp=attention_tp)
    from cais.kernels.algorithms import names
    from cais.kernels.collectives import OPS

    op = _choice("op", point["op"], OPS)
    algo = _choice("algo", point["algo"], names())
    nbytes = parse_bytes(point["bytes"])
    unit = None if point.get("unit") is None else parse_bytes(point["unit"], "unit")
    sets = tuple(config_sets(point).items())
    return CollectiveRunSpec(op, algo, nbytes, SystemSpec(system, gpus, sets, unit, *_LABELS))


_LABELS = ("set.*", "set.gpus=")  # how a refusal names a point's overrides


def check_point(point: Mapping[str, Any]) -> None:
    """Everything :func:`run_point` would refuse, without simulating: the keys and
    values, the system, the model, whether the layer splits over the GPUs and whether
    the run is small enough (UserError)."""
    prepare(point).check()


def _label(point: Mapping[str, Any], limit: int = 120) -> str:
    text = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in point.items())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_points(points: Sequence[Mapping[str, Any]]) -> None:
    """:func:`check_point` on every point, before any runs; the first mistake is a
    one-line UserError saying which point (number and keys) and what is wrong."""
    for i, point in enumerate(points):
        try:
            check_point(point)
        except UserError as exc:
            raise UserError(f"point {i + 1} of {len(points)} ({_label(point)}): {exc}") from None


def run_point(point: Mapping[str, Any]) -> dict[str, Any]:
    """Simulate one point and return its row, the same row ``cais run --out`` /
    ``cais collective --out`` append: every config field, the run's arguments and
    every metric of ``--json``, nested keys dotted (:func:`cais.results.table.run_row`)."""
    from cais.experiments.spec import LayerSpec
    from cais.provenance import content_hash
    from cais.results.recorder import Recorder
    from cais.results.table import run_row

    spec = prepare(point)
    rec = Recorder(links=False, tbs=False, merge=False)  # as the CLI's --out: buffer peaks filled in
    if isinstance(spec, LayerSpec):
        built = spec.build()
        cfg, overrides, model = built
        r = spec.run(built, recorder=rec)
        arguments = {"command": "run", "system": spec.system.name, "batch": model.batch, "seq": model.seq,
                     "overrides": json.dumps(overrides)}
    else:
        cfg, overrides = spec.build()
        r = spec.run((cfg, overrides), recorder=rec)
        arguments = {"command": "collective", "system": spec.system.name, "unit": spec.system.unit,
                     "overrides": json.dumps(overrides)}
    return {**run_row(cfg, arguments, r.as_json()), "provenance.system_sha256": content_hash(cfg.model_dump())}
