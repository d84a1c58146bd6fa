"""Point functions of the reproduction sweeps: each takes one point (a flat dict of
scalars) and returns a flat dict of scalar columns, so that the sweep runner
(:func:`cais.sweep.runner.run_sweep`) can run them in worker processes and resume.

A point names its system (preset or file), the dotted-key overrides as a JSON
object string (``sets``), and what to run. Nested results (per-port tables, time
series) are returned as JSON strings.
"""

from __future__ import annotations

import json
from typing import Any

from cais.errors import UserError
from cais.experiments.spec import CollectiveRunSpec, EpRunSpec, GroupTableNeedSpec, LayerSpec, SystemSpec
from cais.config import SystemConfig
from cais.provenance import content_hash

FLOAT = float


def system_spec(point: dict[str, Any]) -> SystemSpec:
    """The point's system (:mod:`cais.experiments.spec`): its preset or file with its
    ``sets`` applied, then resized to its ``gpus`` (if given), a uniform
    ``gpu_slowdown`` (the compute-speed knob) spread over every GPU of the resized
    system."""
    sets = json.loads(point.get("sets") or "{}")
    pairs = tuple((k, v if isinstance(v, str) else json.dumps(v)) for k, v in sets.items())
    gpus = point.get("gpus")
    return SystemSpec(point.get("system", "dgx-h100"), int(gpus) if gpus else None, pairs, gpus_after_sets=True)


def _hash(cfg: SystemConfig) -> dict[str, str]:
    """The run's system as a content hash (:func:`cais.provenance.content_hash`)."""
    return {"provenance.system_sha256": content_hash(cfg.model_dump())}


def _wire(j: dict[str, Any]) -> dict[str, float]:
    """Bytes on the wire per GPU and direction, the mean over the GPUs (GB): what a
    remote-access strategy changes (each column tile's reload, or one pull)."""
    wire = list((j.get("wire_bytes") or {}).values())
    if not wire:
        return {"wire_up_GB": float("nan"), "wire_down_GB": float("nan")}
    return {f"wire_{d}_GB": sum(w[d] for w in wire) / len(wire) / 1e9 for d in ("up", "down")}


def layer_spec(point: dict[str, Any]) -> LayerSpec:
    """The point's layer period: ``model``, ``scheme``, ``mode``, ``sms``; optional
    ``batch``, ``seq``, the model dimensions ``hidden``, ``ffn_hidden``, ``heads``,
    ``kv_heads``, and a MoE layer's ``attention`` (``tp``, the default, or ``dp``)."""
    shape = tuple((k, point[k]) for k in ("hidden", "ffn_hidden", "heads", "kv_heads") if point.get(k) is not None)
    return LayerSpec(point["model"], point["scheme"], point["mode"], system_spec(point), point.get("sms"),
                     point.get("batch"), point.get("seq"), shape, attention=point.get("attention") or "tp")


def ffn_width(model: Any) -> int:
    """A dense model's FFN width, a MoE model's expert FFN width."""
    return int(getattr(model, "ffn_hidden", None) or model.expert_ffn_hidden)


def layer_point(point: dict[str, Any]) -> dict[str, Any]:
    """One layer period (``model``, ``scheme``, ``mode``, ``sms``; optional ``batch``,
    ``seq``, ``hidden``, ``ffn_hidden``, ``heads``, ``gpus``): total and sub-layer times with
    their bounds, GPU 0's kernel split, link utilisation, merge metrics and FLOPs."""
    spec = layer_spec(point)
    built = spec.build()
    cfg, _, model = built
    r = spec.run(built)
    j = r.as_json()
    out: dict[str, Any] = {"total_us": FLOAT(r.total_us), "gpus_run": r.gpus, "sms_run": r.sms,
                           "tokens": r.tokens, "events": r.events, "sim_wall_s": FLOAT(r.wall_s),
                           "link_util_mean": FLOAT(r.link_util.mean), "link_util_max": FLOAT(r.link_util.max),
                           "comm_kernel_us": FLOAT(r.kernel_us.get("communication", 0.0)),
                           "compute_kernel_us": FLOAT(r.kernel_us.get("computation", 0.0)),
                           "hidden_run": model.hidden, "ffn_run": ffn_width(model),
                           "segments_us": json.dumps({k: round(v, 3) for k, v in r.segments.items()}),
                           # the collective kernels the period ran (algorithm-protocol or production family-path)
                           "collectives_ran": ",".join(sorted(k.split("/")[0] for k in r.collectives_ran))}
    for name in ("L1", "L2", "L3", "L4"):
        s = r.sublayers.get(name)
        for key in ("time_us", "bound_us", "compute_us", "comm_us", "table_peak_kB"):
            out[f"{name}_{key}"] = FLOAT(s[key]) if s and key in s else float("nan")
    peak = j.get("merge_table_peak_kB") or {}
    skew = j.get("arrival_skew_us") or {}
    merge = j.get("merge") or {}
    out.update(table_peak_kB=FLOAT(peak.get("max", float("nan"))),
               skew_mean_us=FLOAT(skew.get("mean", float("nan"))), skew_max_us=FLOAT(skew.get("max", float("nan"))),
               merged=int(merge.get("merged", 0)), bypassed=int(merge.get("bypassed", 0)))
    mm = r.metrics.merge
    out.update(merge_lookups=int(mm.lookups) if mm else 0,
               merge_lookup_wait_us=FLOAT(mm.lookup_wait_us) if mm else 0.0)
    ports = j.get("merge_ports") or {}
    remote = j.get("remote_requests") or {}
    out.update(table_mean_kB=FLOAT((j.get("merge_table_mean_kB") or {}).get("mean", float("nan"))),
               ports_holding=FLOAT(ports.get("holding_sessions", float("nan"))),
               busiest_port_share=FLOAT(ports.get("busiest_share", float("nan"))),
               remote_peak_kB=FLOAT(remote.get("peak_kB", float("nan"))), **_wire(j), **_hash(cfg))
    if r.moe is not None:
        out.update(_moe_columns(r.moe))
    return out


def _moe_columns(moe: dict[str, Any]) -> dict[str, Any]:
    """A MoE layer's expert block (LayerResult.moe) as columns: its routing, the tokens
    each GPU routes, its dispatch, combine, grouped-GEMM and fused-block times (us; the
    backward's included; a fused in-switch kernel's blocks hold all three), the busiest rank's received rows over the mean, the per-(token, rank)
    send matrix's imbalance, and the dynamic multicast group tables' telemetry."""
    received = [int(x) for x in moe["received_rows"]]
    mean = sum(received) / len(received) if received else 0.0
    return {"moe_routing": str(moe["routing"]), "tokens_per_rank": int(moe["tokens_per_rank"]),
            "ep_run": int(moe["ep"]), "experts_run": int(moe["experts"]),
            "dispatch_us": FLOAT(moe["dispatch_us"]), "combine_us": FLOAT(moe["combine_us"]),
            "grouped_gemm_us": FLOAT(moe["grouped_gemm_us"]), "fused_us": FLOAT(moe["fused_us"]),
            "busiest_rank_rows": max(received, default=0),
            "busiest_rank_load": FLOAT(max(received) / mean) if mean else float("nan"),
            "imbalance_rank": FLOAT(moe["imbalance_rank"]),
            "group_table_peak": int(moe.get("group_table_peak", 0)),
            "group_table_overflows": int(moe.get("group_table_overflows", 0))}


def same_run(fn: str, point: dict[str, Any]) -> dict[str, Any]:
    """The point whose run under the point function ``fn`` (its ``module:function``
    name) is ``point``'s, event for event: for a layer period whose scheme runs as
    another scheme there (:meth:`cais.schemes.base.Scheme.same_run_as`: a production
    all-reduce kernel that hands every AllReduce of the period to NCCL runs as
    ``tp-nvls``), that scheme's point; otherwise ``point`` itself, as for a point that
    cannot be built (it fails alone, with its own message). The sweep runner runs one
    point of each such set (:func:`cais.sweep.runner.run_sweeps`)."""
    if fn != f"{__name__}:{layer_point.__name__}":
        return point
    try:
        spec = layer_spec(point)
        other = spec.same_run_as()
    except UserError:
        return point
    return point if other == spec.scheme else {**point, "scheme": other}


def timeline_point(point: dict[str, Any]) -> dict[str, Any]:
    """A layer period recorded over time: mean link utilisation of all GPU-facing port
    directions per bin (``bin_us``) inside sub-layer ``segment``, as a JSON list
    (``series``), plus the :func:`layer_point` columns."""
    from cais.config import PS_PER_US
    from cais.results import Recorder
    from cais.results.ports import port_direction

    spec = layer_spec(point)
    built = spec.build()
    cfg = built[0]
    bin_ps = round(float(point.get("bin_us", 5.0)) * PS_PER_US)
    rec = Recorder(bin_ps=bin_ps, links=True, tbs=False, buffers=False, merge=False)
    r = spec.run(built, recorder=rec)
    util = {name: u for name, u in rec.link_util_bins().items() if port_direction(name) is not None}
    marks = [mk for mk in rec.marks if mk.track == "segments" and mk.name == point.get("segment", "L2")]
    start = min((mk.start_ps for mk in marks), default=0)
    end = max((mk.end_ps for mk in marks), default=rec.horizon_ps())
    lo, hi = start // bin_ps, max(start // bin_ps + 1, -(-end // bin_ps))
    # every port direction's util is relative to its own link bundle; weight by links
    names = sorted(util)
    series = [sum(float(util[n][b]) for n in names) / len(names) for b in range(lo, min(hi, len(util[names[0]])))]
    return {"total_us": FLOAT(r.total_us), "series": json.dumps(series), "bin_width_us": bin_ps / PS_PER_US,
            "segment_start_us": start / PS_PER_US, "segment_end_us": end / PS_PER_US,
            "link_util_mean": FLOAT(r.link_util.mean), **_hash(cfg)}


def collective_point(point: dict[str, Any]) -> dict[str, Any]:
    """One collective (``op``, ``algo``, ``bytes``): time, algbw and busbw."""
    spec = CollectiveRunSpec(point["op"], point["algo"], int(point["bytes"]), system_spec(point))
    built = spec.build()
    cfg = built[0]
    r = spec.run(built)
    return {"time_us": FLOAT(r.time_us), "algbw_GBps": FLOAT(r.algbw_GBps), "busbw_GBps": FLOAT(r.busbw_GBps),
            "sim_wall_s": FLOAT(r.wall_s), **_hash(cfg)}


#: the MoE layer shape the EP kernel points move (DeepSeek-V3's: hidden 7,168, top-8), and
#: DeepEP's tests' expert count for ``ranks`` EP ranks: ``(256 // ranks) * ranks``
EP_HIDDEN, EP_TOPK, EP_EXPERTS = 7168, 8, 256


def ep_experts(ranks: int) -> int:
    """The routed experts of an EP point on ``ranks`` ranks, as DeepEP's tests pick them
    (tests/legacy/test_intranode.py at deepseek-ai/DeepEP@dd758caf: ``(256 // ranks) * ranks``)."""
    return (EP_EXPERTS // ranks) * ranks


def ep_point(point: dict[str, Any]) -> dict[str, Any]:
    """One EP kernel's dispatch and then combine (``kernel``, ``tokens`` per rank) on the
    point's system resized to its ``gpus`` EP ranks: DeepSeek-V3's rows (hidden 7,168,
    top-8, :func:`ep_experts` experts, uniform routing as DeepEP's tests draw it), BF16
    both ways (cais.experiments.ep)."""
    spec = system_spec(point)
    built = spec.build()
    cfg = built[0]
    kernel, tokens, seed = str(point["kernel"]), int(point["tokens"]), int(point.get("seed", 0))
    d, c = (EpRunSpec(kernel, op, tokens, EP_HIDDEN, EP_TOPK, ep_experts(cfg.gpus), "bf16", spec, seed)
            for op in ("dispatch", "combine"))
    drawn = d.routing(built)  # one routing for both ops
    d, c = d.run(built, drawn), c.run(built, drawn)
    return {"dispatch_us": FLOAT(d.time_us), "combine_us": FLOAT(c.time_us), "time_us": FLOAT(d.time_us + c.time_us),
            "dispatch_algbw_GBps": FLOAT(d.algbw_GBps), "combine_algbw_GBps": FLOAT(c.algbw_GBps),
            "experts": ep_experts(cfg.gpus), "imbalance": FLOAT(d.imbalance), "events": d.events + c.events,
            "sim_wall_s": FLOAT(d.wall_s + c.wall_s), **_hash(cfg)}


def ep_table_point(point: dict[str, Any]) -> dict[str, Any]:
    """The dynamic multicast group table one EP call needs
    (:class:`~cais.experiments.spec.GroupTableNeedSpec`, entries bound for the call):
    ``model``'s experts, top-k and group limit, ``ranks`` EP ranks, ``tokens`` per rank,
    ``routing`` (its skew as the ``moe`` section's defaults); the busiest port's entries
    and bytes at the 99th percentile over ``seeds`` routings, against CAIS's 40 KB."""
    call = GroupTableNeedSpec(str(point["model"]), int(point["ranks"]), int(point["tokens"]), str(point["routing"]),
                              int(point.get("seeds", 10))).run()
    return {"entries_p99": int(call["entries_p99"]), "bytes_p99": int(call["bytes_p99"]),
            "entry_bytes": int(call["entry_bytes"]), "of_cais_40KB": FLOAT(call["of_cais_40KB"]),
            "max_entries": int(call["max_entries"])}
