"""The ``cais`` command."""

from __future__ import annotations

import argparse
import errno
import gc
import json
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar

from rich.console import Console as _RichConsole
from rich.table import Table

from cais import DISTRIBUTION, __version__
from cais.errors import UserError
from cais.config import PS_PER_US, SystemConfig, list_systems, load_system
from cais.kernels.algorithms import names as algorithm_names
from cais.kernels.collectives import ALGOS, OPS
from cais.kernels.protocols import PROTOCOL_CHOICES
from cais.machine import Stalled
from cais.provenance import Provenance, collect
from cais.report.trace import DEFAULT_TB_LIMIT
from cais.results.fit import print_table
from cais.results.recorder import DEFAULT_BIN_PS, Recorder
from cais.units import parse_size
from cais.workload.graph import sublayer_legend

if TYPE_CHECKING:
    from cais.experiments.collective import CollectiveResult
    from cais.experiments.layer import LayerResult
    from cais.experiments.spec import SystemSpec
    from cais.progress import RunProgress
    from cais.reproduce.report import Section
    from cais.workload.models import ModelSpec
    from cais.workload.moe import MoeSpec


T = TypeVar("T")


class Console(_RichConsole):
    """rich's Console, except on a closed stdout: rich's own handling ends the process
    with exit code 1 (``SystemExit(1)``), which the contract calls a bug; this one
    raises BrokenPipeError, which :func:`main` turns into exit code 141, quietly
    (docs/errors.md)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more is written through this console
        raise BrokenPipeError(errno.EPIPE, "stdout was closed")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2), and negative numbers read as values:
    argparse takes an argument that starts with ``-`` for an option unless it is a
    plain number (``-1``, ``-.5``), so ``--bytes -1M``, ``--trace-bin-us -1e-3`` or
    ``--bytes -nan`` were ``expected one argument``; here anything that starts with
    ``-`` and a digit, ``-.`` and a digit, or is ``-inf`` / ``-nan`` is a value, and the
    flag's own parser refuses it naming the flag and what it allows. No option of the
    command starts with a single ``-`` and a digit, ``i`` or ``n``."""

    NEGATIVE_NUMBER = re.compile(r"^-(?:\.?\d|(?:inf|infinity|nan)$)", re.IGNORECASE)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._negative_number_matcher = self.NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"cais: error: {message}\n")

    def _print_message(self, message: str, file: IO[str] | None = None) -> None:
        """As argparse's, except that a closed stdout (``cais --help | head -1``) is
        not ignored: its BrokenPipeError reaches main(), which exits 141."""
        if not message:
            return
        try:
            (file or sys.stderr).write(message)
        except BrokenPipeError:
            if file is sys.stdout:
                raise
        except (AttributeError, OSError):
            pass


class UsageError(UserError):
    """A mistake in the command-line arguments: reported as one line, exit code 2."""


def _int(text: str) -> int:
    """A whole number: decimal (leading zeros allowed) or 0x / 0o / 0b."""
    text = text.strip().replace("_", "")
    try:
        return int(text, 10)
    except ValueError:
        return int(text, 0)


def _positive_int(text: str) -> int:
    try:
        value = _int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _size(text: str) -> int:
    """Bytes, as :func:`cais.units.parse_size` reads them everywhere: a whole number
    (1048576, 1e9) or K/M/G/T, KiB/MiB/GiB/TiB (binary: 1G = 2**30); KB/MB/GB refused."""
    try:
        return parse_size(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _system(args: argparse.Namespace, **overrides: object) -> SystemConfig:
    return load_system(args.system, **overrides)


def _key_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (split at the first ``=``) for --set."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. link.bandwidth_GBps=50), got '{text}'")
    return key.strip(), value


_NAME = r"[a-z][a-z0-9_]*"


def as_flags(message: str, options: Collection[str]) -> str:
    """A library message in the words of the command the user ran. Library code names
    parameters, not flags (docs/errors.md): ``sms: must be between 1 and 132 ...``,
    ``...; use sim='full'``. Where ``--name`` (underscores as dashes) is one of
    ``options``, the option strings of the subcommand that ran, the message's first
    word ``name`` (before ``:`` or a space) becomes ``--name``, and an inline
    ``name='value'`` becomes ``--name value``. Nothing else changes: other words, names
    that are not options of this command (a sweep spec's keys) and messages already
    worded in flags (``--set: ...``) stay as they are."""
    def flag(name: str) -> str | None:
        text = "--" + name.replace("_", "-")
        return text if text in options else None

    first = re.match(rf"({_NAME})(?=[: ])", message)
    if first and (f := flag(first[1])):
        message = f + message[first.end():]

    def inline(m: re.Match[str]) -> str:
        f = flag(m[1])
        return f"{f} {m[2]}" if f else m[0]
    return re.sub(rf"(?<![\w.-])({_NAME})='([^'\s]*)'", inline, message)


def _for_flag(flag: str, fn: Callable[..., T], *args: object) -> T:
    """Call ``fn``; a UserError becomes one naming ``flag``."""
    try:
        return fn(*args)
    except UserError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def _count(text: str) -> int:
    try:
        value = _int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got '{text}'") from None
    if value != value:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number (NaN); expected a positive number")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse bad --trace / --out paths and trace options without --trace before
    spending time on the run; fill in the trace options' defaults."""
    from cais.results.table import table_format

    for flag, value in (("--trace-tb-limit", args.trace_tb_limit), ("--trace-bin-us", args.trace_bin_us)):
        if value is not None and not args.trace:
            raise UsageError(f"{flag}: sets how --trace writes its timeline; give --trace FILE.json too")
    if args.trace_tb_limit is None:
        args.trace_tb_limit = DEFAULT_TB_LIMIT
    if args.trace_bin_us is None:
        args.trace_bin_us = DEFAULT_BIN_PS / PS_PER_US
    _nonempty("--out", args.out, "a file name ending in .parquet or .csv")
    _nonempty("--trace", args.trace, "a file name ending in .json")
    if args.out is not None:
        _for_flag("--out", table_format, args.out)
    if args.trace is not None and Path(args.trace).suffix.lower() != ".json":
        raise UsageError(f"--trace: the timeline is a JSON file; its name must end in .json, got '{args.trace}'")
    for flag, path in (("--trace", args.trace), ("--out", args.out)):
        if path is None:
            continue
        parent = Path(path).parent
        try:
            if not parent.is_dir():
                raise UsageError(f"{flag}: no directory {parent} for '{path}'")
            if Path(path).is_dir():
                raise UsageError(f"{flag}: '{path}' is a directory; give a file name")
        except OSError as exc:  # a directory on the way that may not be entered
            raise UsageError(f"{flag}: cannot reach '{path}': {exc.strerror}") from None
        if not os.access(parent, os.W_OK):
            raise UsageError(f"{flag}: cannot write '{path}': no write permission in directory {parent}")
        _probe(flag, path, parent)


def _nonempty(flag: str, path: str | None, what: str) -> None:
    """UsageError if a path option was given as the empty string (``--out ''``): it
    names no file, and would otherwise mean "none" or the current directory."""
    if path is not None and not path:
        raise UsageError(f"{flag}: the path is empty; give {what}")


def _probe(flag: str, path: str | Path, where: Path) -> None:
    """Create and remove a file in directory ``where``, as the writer of ``path`` will
    (its temporary file goes there), so that a directory that takes no files although
    it looks writable (``/proc``, a read-only mount, a full disk) is refused before the
    run, naming the path the user gave. Leaves nothing behind."""
    probe = where / f".{Path(path).name or 'out'}.{os.getpid()}.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise UsageError(f"{flag}: cannot write '{path}': creating a file in {where} failed "
                         f"({exc.strerror or exc})") from None
    probe.unlink(missing_ok=True)


def _recorder(args: argparse.Namespace) -> Recorder | None:
    """A full recorder for --trace; a cheap one (buffer credit logs, kernels) for
    --json / --out, whose buffer peaks need it (merge-table metrics need no log);
    none otherwise."""
    if args.trace:
        return Recorder(bin_ps=max(1, round(args.trace_bin_us * PS_PER_US)))
    if args.json or args.out:
        return Recorder(links=False, tbs=False, merge=False)
    return None


def _write_outputs(args: argparse.Namespace, cfg: SystemConfig, rec: Recorder | None,
                   arguments: dict[str, object], result: CollectiveResult | LayerResult,
                   overrides: dict[str, object]) -> list[str]:
    """Write the --trace timeline and the --out row of a finished run, both or neither:
    each goes to a temporary file first, and they replace their targets only once
    both are written. Returns the lines that say what was written."""
    staged: list[tuple[Path, str]] = []
    notes = []
    try:
        if args.trace:
            from cais.report.trace import stage_trace

            assert rec is not None
            _for_flag("--trace-bin-us", rec.n_bins)
            tmp, events = _for_flag("--trace", stage_trace, args.trace, rec, args.trace_tb_limit)
            staged.append((tmp, args.trace))
            notes.append(f"trace: {args.trace} ({events:,} events; open in ui.perfetto.dev)")
        if args.out:
            from cais.results.table import run_row, stage_row

            row = {**run_row(cfg, arguments, result.as_json()), **_provenance(args, cfg, overrides).columns()}
            tmp, rows = _for_flag("--out", stage_row, args.out, row)
            staged.append((tmp, args.out))
            notes.append(f"results: row {rows} of {args.out}")
        while staged:
            tmp, path = staged[0]
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise UsageError(f"cannot write {path}: {exc.strerror}") from None
            staged.pop(0)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    return notes


def _provenance(args: argparse.Namespace, cfg: SystemConfig, overrides: dict[str, object]) -> Provenance:
    """Where this command's result comes from: version, commit, date, the command
    line, the system with its config hash and the --set values."""
    return collect(getattr(args, "command_line", "cais"), args.system, cfg.model_dump(), overrides)


def _printed_json(args: argparse.Namespace, result: object, cfg: SystemConfig,
                  overrides: dict[str, object] | None = None) -> bool:
    """Print ``result.as_json()`` with the --set values (``overrides``) and the
    provenance as one JSON object if --json."""
    if args.json:
        extra: dict[str, object] = {} if overrides is None else {"overrides": overrides}
        prov = _provenance(args, cfg, overrides or {}).as_json()
        print(json.dumps({**result.as_json(), **extra, "provenance": prov}))  # type: ignore[attr-defined]
    return bool(args.json)


def _system_label(cfg: SystemConfig, overrides: dict[str, object]) -> str:
    """The system's name, with the --set values that changed it."""
    if not overrides:
        return cfg.name
    return f"{cfg.name} with " + ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items())


def _print_notes(notes: list[str]) -> None:
    for line in notes:
        Console().print(line)


def _print_table(title: str, rows: list[tuple[str, str]]) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("quantity", style="bold")
    table.add_column("value", justify="right")
    for k, v in rows:
        table.add_row(k, v)
    print_table(Console(), table)


def _progress_asked(args: argparse.Namespace) -> bool | None:
    """Whether progress is to be shown, as asked: --progress / --no-progress, else the
    environment's CAIS_PROGRESS (0 or 1: a harness that captures the output sets 0),
    else None (the command's own default)."""
    if getattr(args, "progress", None) is not None:
        return bool(args.progress)
    env = os.environ.get("CAIS_PROGRESS")
    return None if env is None else env.strip() not in ("0", "", "false", "no")


def _progress(args: argparse.Namespace) -> RunProgress:
    """The run's progress report on stderr: the bar where stderr is a terminal and
    --json is not given, or when --progress asks; never with --no-progress."""
    from cais.experiments.layer import MIRROR_SCHEMES
    from cais.progress import RunProgress

    asked = _progress_asked(args)
    show = asked if asked is not None else (sys.stderr.isatty() and not args.json)
    symmetric = getattr(args, "scheme", None) in (None, *MIRROR_SCHEMES)  # collectives have no scheme
    hint = ("; '--sim mirror' simulates GPU 0 only, about N times fewer events, where the run is symmetric"
            if args.sim == "full" and symmetric else "")
    return RunProgress(show=show, hint=hint)


@contextmanager
def _offer_mirror(args: argparse.Namespace, cfg: SystemConfig, mirrored: Callable[[], None]) -> Iterator[None]:
    """A run refused as too big (``cais.limits.TooBig``) that mirror mode could
    simulate (--sim full, a symmetric run: a collective, or a scheme of
    MIRROR_SCHEMES, on alike GPUs and an NVLS switch) gets ``or sim='mirror'`` added
    to its hint, with its estimate there; the command shows it as ``--sim mirror``.
    Only advice that works is given: ``mirrored`` runs the checks of the same run with
    --sim mirror (the spec's ``check``: its size, its memory footprint, its symmetry),
    and a refusal there means no offer."""
    from cais.experiments.collective import mirror_misfit
    from cais.experiments.layer import MIRROR_SCHEMES
    from cais.limits import TooBig, mirror_hint

    try:
        yield
    except TooBig as exc:
        scheme = getattr(args, "scheme", None)  # collectives have no scheme
        if args.sim != "full" or scheme not in (None, *MIRROR_SCHEMES) or mirror_misfit(cfg):
            raise
        hint = mirror_hint(exc, cfg.gpus)
        if not hint:
            raise
        try:
            mirrored()
        except UserError:  # --sim mirror would be refused too: offering it would be advice that fails
            raise exc from None
        raise TooBig(str(exc) + hint, exc.estimate, exc.limit) from None


def _system_spec(args: argparse.Namespace, unit: int | None = None) -> SystemSpec:
    """The run's system as the command line gave it (--system, --gpus, --set)."""
    from cais.experiments.spec import SystemSpec

    return SystemSpec(args.system, args.gpus, tuple(args.set), unit, "--set", "--set gpus=")


def cmd_collective(args: argparse.Namespace) -> None:
    from cais.experiments.spec import CollectiveRunSpec

    spec = CollectiveRunSpec(args.op, args.algo, args.bytes, _system_spec(args, args.unit), args.protocol, args.sim)
    cfg, overrides = spec.build()
    _check_outputs(args)
    rec = _recorder(args)
    with _progress(args) as progress, _offer_mirror(args, cfg, lambda: replace(spec, sim="mirror").check()):
        r = spec.run((cfg, overrides), recorder=rec, progress=progress)
    notes = _write_outputs(args, cfg, rec, {"command": "collective", "system": args.system, "unit": args.unit,
                                            "sim": r.sim, "overrides": json.dumps(overrides)}, r, overrides)
    if not _printed_json(args, r, cfg, overrides):
        _print_collective(_system_label(cfg, overrides), r)
        _print_notes(notes)


def _print_collective(system: str, r: CollectiveResult) -> None:
    _print_table(f"{r.algo} {r.op}, {r.gpus} GPUs, {system}", [
        ("size", f"{r.nbytes:,} B"), ("time", f"{r.time_us:,.2f} us"),
        ("algorithm / protocol", f"{r.algo} / {r.protocol}"
         + (f", {r.nvls_buffers} buffers (collective.nvls_buffers)" if r.nvls_buffers else "")
         + {"nccl": " (NCCL's choice by size; --algo, --protocol)",
            "nccl-protocol": " (forced by --algo; the protocol NCCL's choice by size)"}.get(r.chosen_by, "")),
        ("algbw", f"{r.algbw_GBps:,.1f} GB/s"), ("busbw", f"{r.busbw_GBps:,.1f} GB/s"),
        ("link utilisation, mean of GPU directions", f"{100 * r.link_util.mean:.1f} %"),
        ("busiest port direction, wire busy", f"{100 * r.wire_util:.1f} % ({r.link_util.busiest})"),
        ("simulated events", f"{r.events:,}"), ("wall time", f"{r.wall_s:.2f} s"),
        ("simulation", "mirror (GPU 0 simulated, the others its images; --sim)" if r.sim == "mirror"
         else "full (every GPU)")])


def cmd_ep(args: argparse.Namespace) -> None:
    from cais.experiments.ep import run_ep

    cfg = _system(args, **({"gpus": args.gpus} if args.gpus else {}))
    hidden, topk, experts, n_group, topk_group = args.hidden, args.topk, args.experts, 1, 1
    if args.model:
        from cais.workload.moe import load_moe_model

        mm = load_moe_model(args.model)
        hidden, topk, experts = hidden or mm.hidden, topk or mm.topk, experts or mm.experts
        n_group, topk_group = mm.n_group, mm.topk_group
    for name, value in (("hidden", hidden), ("topk", topk), ("experts", experts)):
        if value is None:
            raise UserError(f"{name}: give --{name} or --model (a MoE preset, see 'cais models')")
    r = run_ep(cfg, args.kernel, args.op, args.tokens, hidden, topk, experts, args.dtype, args.sms,
               args.routing, args.seed, args.alpha, args.sigma, args.trace, args.capacity_factor, args.capacity,
               n_group, topk_group, host_sync=args.host_sync, functional=args.functional, chunk=args.chunk)
    if _printed_json(args, r, cfg):
        return
    _print_table(f"{r.kernel} {r.op}, {r.gpus} GPUs, {cfg.name}", [
        ("tokens per rank x hidden", f"{r.tokens} x {r.hidden}"), ("top-k of experts", f"{r.topk} of {r.experts}"),
        ("dtype", r.dtype), ("time", f"{r.time_us:,.2f} us"),
        ("algbw (as DeepEP's tests count it)", f"{r.algbw_GBps:,.1f} GB/s"),
        ("bytes counted", f"{r.bytes_counted:,} ({r.counted_as})"), ("bytes the kernel moved from rank 0",
                                                                     f"{r.own_bytes:,}"),
        ("imbalance (busiest endpoint / mean)", f"{r.imbalance:.3f}"), ("dropped (token, expert)", str(r.dropped)),
        *([("padding rows (capacity pad), bytes sent of them", f"{r.padded:,}, {r.pad_bytes:,}")]
          if args.capacity == "pad" else []),
        ("functional check", "-" if r.correct is None else ("exact" if r.correct else "WRONG")),
        ("simulated events", f"{r.events:,}"), ("wall time", f"{r.wall_s:.2f} s")])


def cmd_gemm(args: argparse.Namespace) -> None:
    from cais.experiments.gemm import run_gemm

    from cais.experiments.spec import SystemSpec

    cfg, overrides = SystemSpec(args.system, None, tuple(args.set), None, "--set", "--set gpus=").build()
    r = run_gemm(cfg, args.m, args.n, args.k, args.sms)
    if _printed_json(args, r, cfg, overrides):
        return
    launch = {"fitted": "the fitted per-GEMM overhead", "graph": "the dependent-kernel gap of a CUDA graph",
              "eager": "the host's issue of one op"}[r.launch]
    _print_table(f"bf16 GEMM on one {cfg.gpu.name}", [
        ("M x N x K", f"{r.m} x {r.n} x {r.k}"), ("SMs", str(r.sms)),
        ("tile", f"{r.tile[0]} x {r.tile[1]}"), ("tiles", str(r.tiles)),
        ("split", r.split + (f" ({r.units} CTAs)" if r.units else "")),
        ("launch", f"{r.launch} ({launch})"),
        ("time", f"{r.time_us:,.2f} us"), ("throughput", f"{r.tflops:,.1f} TFLOP/s")])


def cmd_run(args: argparse.Namespace) -> None:
    from cais.experiments.layer import warnings_of
    from cais.experiments.spec import LayerSpec
    from cais.workload.moe import MoeSpec

    spec = LayerSpec(args.model, args.scheme, args.mode, _system_spec(args), args.sms, args.batch, args.seq,
                     sim=args.sim, attention=args.attention or "tp", expert_tp=args.expert_tp or 1,
                     attention_tp=args.attention_tp)
    cfg, overrides, model = built = spec.build()
    if args.attention and not isinstance(model, MoeSpec):
        raise UserError(f"attention: it sets a mixture-of-experts layer's attention; {model.name} is dense "
                        "(its attention is under the scheme's TP)")
    if args.attention_tp is not None and not isinstance(model, MoeSpec):
        raise UserError(f"attention_tp: it sets a mixture-of-experts layer's attention TP groups; {model.name} is "
                        "dense (its attention is under the scheme's TP over every GPU)")
    if args.expert_tp and not isinstance(model, MoeSpec):
        raise UserError(f"expert_tp: it splits a mixture-of-experts layer's experts; {model.name} is dense "
                        "(its MLP is under the scheme's TP)")
    _check_outputs(args)
    rec = _recorder(args)
    with _progress(args) as progress, _offer_mirror(args, cfg, lambda: replace(spec, sim="mirror").check(built)):
        r = spec.run(built, recorder=rec, progress=progress)
    notes = _write_outputs(args, cfg, rec, {"command": "run", "system": args.system, "batch": model.batch,
                                            "seq": model.seq, "sim": r.sim, "overrides": json.dumps(overrides)}, r, overrides)
    if not _printed_json(args, r, cfg, overrides):
        _print_layer(_system_label(cfg, overrides), model, r)
        _print_notes(notes)
    for line in warnings_of(r):
        print(f"cais: warning: {line}", file=sys.stderr)


def _print_layer(system: str, model: ModelSpec | MoeSpec, r: LayerResult) -> None:
    from cais.workload.moe import MoeSpec
    padded = f", {r.tokens} token rows padded to {r.padded_tokens}" if r.padding else ""
    table = Table(title=f"{model.name}, {r.scheme}, {r.mode}: one layer period on {system} "
                        f"({r.gpus} GPUs x {r.sms} SMs{padded})")
    for col in ("part", "time (us)", "lower bound (us)", "bound: compute / comm (us)", "gap to bound"):
        table.add_column(col, justify="right")
    for name, sub in r.sublayers.items():
        gap = sub["time_us"] / sub["bound_us"] - 1 if sub["bound_us"] else 0.0
        table.add_row(name, f"{sub['time_us']:,.1f}", f"{sub['bound_us']:,.1f}",
                      f"{sub['compute_us']:,.1f} / {sub['comm_us']:,.1f}", f"{100 * gap:+.0f} %")
    in_sublayers = sum(sub["time_us"] for sub in r.sublayers.values())
    rest = [name for name in r.segments if name not in r.sublayers]
    table.add_row("rest", f"{max(0.0, r.total_us - in_sublayers):,.1f}", "", "", "")
    table.add_row("total", f"{r.total_us:,.1f}", "", "", "", style="bold")
    print_table(Console(), table)
    for name in r.sublayers:
        Console().print(f"{name}: {sublayer_legend(name, getattr(model, 'norm', 'rmsnorm'))}")
    Console().print(f"rest: the period outside L1-L4 ({', '.join(rest) or 'nothing'}); overlapping schemes run "
                    "some of it inside the sub-layers' spans. gap to bound: time / max(compute, comm) - 1.")
    if isinstance(model, MoeSpec):
        _print_moe(r)
    else:
        _print_kv_note(model, r.gpus)
    if r.token is not None:
        t = r.token
        parts = ", ".join(f"{k.replace('_', ' ')} {v:,.1f}" for k, v in t.tail.items())
        dense = getattr(t, "dense_layers", None)
        if dense is None:
            graph = f" (the CUDA graph of {t.graph_batch} sequences)" if t.graph_batch else ""
            Console().print(f"per output token: {t.token_us:,.1f} us = {t.layers} layers x {t.layer_us:,.1f} us"
                            f"{graph} + tail {t.tail_us:,.1f} us ({parts}); the host's own step is not included "
                            "(docs/compute-model.md, \"The decode step\")", highlight=False)
        else:
            first = f" + {dense} dense layers x {t.dense_layer_us:,.1f} us ({t.dense_scheme})" if dense else ""
            Console().print(f"per output token: {t.token_us:,.1f} us = {t.layers} MoE layers x {t.layer_us:,.1f} us"
                            f"{first} + tail {t.tail_us:,.1f} us ({parts}); the host's own step is not included "
                            "(docs/moe.md, \"The decode step per output token\")", highlight=False)
    Console().print(f"link utilisation: mean {100 * r.link_util.mean:.1f} % (GPU directions), busiest port "
                    f"direction {100 * r.link_util.max:.1f} % ({r.link_util.busiest}), over the period; "
                    f"{r.events:,} events in {r.wall_s:.1f} s; simulation: "
                    + ("mirror (GPU 0 simulated, the others its images; --sim)" if r.sim == "mirror"
                       else "full (every GPU)"))
    k = r.kernel_us
    Console().print(f"GPU 0 kernel time: collectives {k['communication']:,.0f} us, other kernels "
                    f"{k['computation']:,.0f} us (overlapping kernels both count)")
    if r.collectives_ran:
        Console().print(_ran_text(r), highlight=False)
    other = ("ep-nccl" if r.scheme != "ep-nccl" else "ep-deepep") if r.moe is not None else \
        ("cais" if r.scheme != "cais" else "tp-nvls")
    Console().print(f"next: --json for every metric, --trace FILE.json for the timeline, or compare "
                    f"'--scheme {other}'")


def _print_moe(r: LayerResult) -> None:
    """A MoE layer's expert block: its EP kernel, times and routing imbalance."""
    mo = r.moe or {}
    etp = f" x expert TP {mo['expert_tp']} (expert-TP collectives {mo['expert_tp_us']:,.1f} us)" \
        if int(str(mo.get("expert_tp", 1))) > 1 else ""
    group = int(str(mo.get("attention_tp") or 0))
    attn = f"{mo['attention']} in groups of {group} GPUs" if 1 < group < r.gpus else str(mo["attention"])
    attn += " (MLA's own ops)" if mo.get("mla") else ""
    Console().print(f"experts: EP {mo['ep']}{etp} with the '{mo['kernel']}' kernel, attention {attn}, "
                    f"{mo['tokens_per_rank']} tokens per GPU, top-{mo['topk']} of {mo['experts']}; dispatch "
                    f"{mo['dispatch_us']:,.1f} us, combine {mo['combine_us']:,.1f} us, grouped GEMMs "
                    f"{mo['grouped_gemm_us']:,.1f} us, shared experts {mo['shared_us']:,.1f} us (backward included); "
                    f"send imbalance (busiest endpoint / mean) {mo['imbalance_rank']:.3f} per (token, rank), "
                    f"{mo['imbalance_expert']:.3f} per (token, expert)", highlight=False)
    if mo.get("capacity", "none") != "none":
        Console().print(f"capacity: {mo['capacity']} at factor {mo['capacity_factor']} (moe.capacity_factor): "
                        f"{mo['dropped']:,} (token, expert) selections dropped, {mo['padded_rows']:,} padding rows "
                        "added, over every GPU", highlight=False)


def _ran_text(r: LayerResult) -> str:
    """What the period's collectives ran, algorithm/protocol x calls, and who chose it."""
    from cais.schemes import get_scheme
    from cais.schemes.base import NCCL_CHOICE

    ran = ", ".join(f"{k} x {n}" for k, n in r.collectives_ran.items())
    scheme = get_scheme(r.scheme)
    if scheme.algo == NCCL_CHOICE:
        who = "NCCL's own algorithm and protocol by size" + (
            " where the scheme's kernel hands a call to NCCL" if scheme.family == "production" else "")
    elif r.collective_choice == "nccl":
        who = "the algorithm the scheme names, forced; its protocol NCCL's choice by size (collective.layer_choice)"
    else:
        who = "the algorithm the scheme names, in Simple (collective.layer_choice)"
    return f"collectives ran: {ran} ({who})"


def _print_kv_note(model: ModelSpec, gpus: int) -> None:
    """The model's note on splitting over ``gpus`` TP ranks, if any: KV heads
    replicated where there are fewer than ranks (``ModelSpec.check_tp``,
    docs/models.md)."""
    note = model.check_tp(gpus)
    if note:
        Console().print(f"note: {note}", highlight=False)


def cmd_sweep(args: argparse.Namespace) -> None:
    """Run a grid of points (docs/sweeps.md); failed points are rows, not an exit code."""
    from cais.sweep.command import sweep_command

    _nonempty("--out", args.out, "a file name ending in .parquet or .csv")
    sweep_command(args.spec, args.out, args.workers, args.ray, args.keep_errors, not args.no_progress,
                  args.command_line, Console())


def cmd_schemes(args: argparse.Namespace) -> None:
    from cais.schemes import moe_schemes, schemes

    for title, found in (("schemes", schemes()),
                         ("mixture-of-experts schemes (MoE models; one per EP kernel, docs/moe.md)", moe_schemes())):
        table = Table(title=title)
        table.add_column("name", style="bold")
        table.add_column("what it does")
        for name, cls in found.items():
            table.add_row(name, cls.summary)
        print_table(Console(), table)


def cmd_models(args: argparse.Namespace) -> None:
    from cais.workload.models import list_models, load_model

    table = Table(title="models")
    table.add_column("name", no_wrap=True, style="bold")
    for col in ("hidden", "ffn", "heads/kv", "layers", "seq x batch"):
        table.add_column(col, justify="right")
    table.add_column("mlp, norm")
    for name in list_models():
        m = load_model(name)
        table.add_row(name, str(m.hidden), str(m.ffn_hidden), f"{m.heads}/{m.kv}", str(m.layers),
                      f"{m.seq} x {m.batch}", f"{m.activation}, {m.norm}")
    print_table(Console(), table)
    from cais.workload.moe import list_moe_models, load_moe_model

    moe = Table(title="mixture-of-experts models (cais ep; docs/moe.md)")
    moe.add_column("name", no_wrap=True, style="bold")
    for col in ("hidden", "experts", "top-k", "expert ffn", "shared", "groups", "dense layers", "attention"):
        moe.add_column(col, justify="right")
    for name in list_moe_models():
        mm = load_moe_model(name)
        moe.add_row(name, str(mm.hidden), str(mm.experts), str(mm.topk), str(mm.expert_ffn_hidden),
                    str(mm.shared_experts), f"{mm.topk_group}/{mm.n_group}", str(mm.dense_layers), mm.attention)
    print_table(Console(), moe)


def cmd_systems(args: argparse.Namespace) -> None:
    table = Table(title="systems")
    table.add_column("name", style="bold")
    table.add_column("description")
    for name, desc in list_systems().items():
        table.add_row(name, desc)
    print_table(Console(), table)


def cmd_demo(args: argparse.Namespace) -> None:
    """The main job: NVLS and ring AllReduce, a GEMM, and every scheme on a layer."""
    from cais.experiments.collective import check_collective, run_collective
    from cais.experiments.gemm import run_gemm
    from cais.experiments.layer import check_layer
    from cais.schemes import schemes
    from cais.workload.models import load_model

    cfg = _system(args)
    model = load_model(args.model)  # every argument is checked before anything runs or prints
    if cfg.gpu.sms < 66:
        raise UsageError(f"--system: the demo runs layers on the paper's 66 SMs per GPU; {cfg.name} has "
                         f"{cfg.gpu.sms}")
    for algo in ALGOS:
        check_collective(cfg, "allreduce", algo, args.bytes)
    for name, cls in schemes().items():
        if cls().in_demo:
            check_layer(cfg, model, name, "prefill", 66)
    table = Table(title=f"AllReduce on {cfg.name} ({cfg.gpus} GPUs), {args.bytes / 2**20:g} MiB")
    for col in ("algorithm", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "busiest link busy", "correct"):
        table.add_column(col, justify="right")
    for algo in ALGOS:
        r = run_collective(cfg, "allreduce", algo, args.bytes, functional=False)
        f = run_collective(cfg.with_overrides(gpus=4), "allreduce", algo, 3 * 4099 * 2, functional=True)
        table.add_row(algo, f"{r.time_us:,.1f}", f"{r.algbw_GBps:,.1f}", f"{r.busbw_GBps:,.1f}",
                      f"{100 * r.wire_util:.1f} %", "yes" if f.correct else "NO")
    print_table(Console(), table)
    g = run_gemm(cfg, 9216, 1536, 4096)
    gt = Table(title=f"bf16 GEMM on one {cfg.gpu.name}")
    for col in ("M x N x K", "SMs", "tile", "time (us)", "TFLOP/s"):
        gt.add_column(col, justify="right")
    gt.add_row(f"{g.m} x {g.n} x {g.k}", str(g.sms), f"{g.tile[0]}x{g.tile[1]}", f"{g.time_us:,.1f}",
               f"{g.tflops:,.1f}")
    print_table(Console(), gt)
    Console().print("'correct': the same algorithm on 4 GPUs in functional mode matches numpy's sum exactly.")
    _demo_layers(cfg, model)


def _check_reproduce(args: argparse.Namespace) -> None:
    """What ``cais reproduce`` checks before it runs anything (docs/errors.md): --out
    DIR, then the experiment names: an existing DIR must be a directory one may
    write in; a missing one is created, but only as the last part of the path (its
    parent must be a directory one may write in, as for ``run --out``); and with
    --cached, DIR/runs must hold runs of the experiments asked for. The paths come
    first: they need none of the experiments' (slow) imports."""
    _nonempty("--out", args.out, "a directory (the CSVs, PNGs, runs and report go in it)")
    out = Path(args.out)
    try:
        _check_out_dir(out)
    except OSError as exc:  # a directory on the way that may not be entered
        raise UsageError(f"--out: cannot reach '{out}': {exc.strerror}") from None
    from cais.reproduce.run import expand

    names = expand(args.experiments)
    if args.cached:  # the system and models first: the runs asked for depend on them
        _reproduce_system(args)
        _check_cached(args, names, out)


def _reproduce_system(args: argparse.Namespace) -> SystemConfig:
    """reproduce's system with its --set values, after checking them and --models;
    a mistake names its flag (``--set foo=bar: ...``, ``--models: unknown model ...``),
    as ``cais run`` does."""
    from cais.config import apply_overrides
    from cais.workload.models import load_model

    cfg = _for_flag("--set", apply_overrides, _system(args), dict(args.set))
    for m in args.models or ():
        try:
            load_model(m)
        except UserError as exc:
            raise UsageError(f"--models: {str(exc).removeprefix('model: ')}") from None
    return cfg


def _check_out_dir(out: Path) -> None:
    """reproduce's --out DIR: an existing directory one may write in, or a new last
    part of a path to one (UsageError otherwise)."""
    if out.is_dir():
        if not os.access(out, os.W_OK | os.X_OK):
            raise UsageError(f"--out: cannot write in directory {out}")
        _probe("--out", out, out)
        runs = out / "runs"
        if runs.exists() and not runs.is_dir():
            raise UsageError(f"--out: {runs} is a file; the runs go in a directory of that name")
    elif out.exists() or out.is_symlink():
        raise UsageError(f"--out: '{out}' is " + ("a file" if out.exists() else "a broken link")
                         + "; give a directory (the CSVs, PNGs, runs and report go in it)")
    else:
        parent = out.parent
        if not parent.is_dir():
            raise UsageError(f"--out: no directory {parent} for '{out}' (only its last part is created)"
                             if not parent.exists() else f"--out: {parent} is not a directory, in '{out}'")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UsageError(f"--out: cannot create '{out.name}' in directory {parent}: not writable")
        _probe("--out", out, parent)


def _check_cached(args: argparse.Namespace, names: list[str], out: Path) -> None:
    """--cached simulates nothing: refuse it where DIR/runs holds none of the runs the
    experiments ``names`` analyse (a report of empty tables is no result)."""
    from cais.reproduce.experiments import EXPERIMENTS, Context
    from cais.sweep.grid import point_id

    ctx = Context(args.system, dict(args.set), args.quick, out, tuple(args.models or ()), tuple(args.modes or ()))
    wanted: dict[str, set[str]] = {}  # the runs table of each point function -> the point ids asked for
    for name in names:
        for fn, point in EXPERIMENTS[name].points(ctx):
            wanted.setdefault(fn, set()).add(point_id(point))
    if not wanted:  # analysis only (area): no runs needed
        return
    runs = out / "runs"
    for fn, ids in wanted.items():
        table = runs / f"{fn.rsplit(':', 1)[-1]}.parquet"
        if table.is_file():
            import pandas as pd

            try:
                have = set(pd.read_parquet(table, columns=["point_id"])["point_id"])
            except Exception:  # noqa: BLE001 - not a runs table: say which file
                raise UsageError(f"--cached: {table} is not a readable runs table (Parquet with a point_id "
                                 "column); move it away or run without --cached") from None
            if ids & have:
                return
    grid = "quick grid" if args.quick else "full grid"
    raise UsageError(f"--cached: no cached runs of {', '.join(names)} ({grid}) in {runs}; run without --cached "
                     "first, which simulates them and keeps them there")


def cmd_reproduce(args: argparse.Namespace) -> None:
    """Reproduce the paper's figures and tables (and the studies past it): CSVs, PNGs,
    report.md and report.html in --out; prints each experiment's summary table and
    verdict as it finishes."""
    _check_reproduce(args)
    from cais.reproduce.experiments import Context
    from cais.reproduce.run import expand, reproduce
    from cais.reproduce.verdict import quick_warning

    names = expand(args.experiments)  # every argument is checked before anything runs
    sets = dict(args.set)
    cfg = _reproduce_system(args)
    ctx = Context(args.system, sets, args.quick, Path(args.out), tuple(args.models or ()), tuple(args.modes or ()))
    prov = collect(args.command_line, args.system, cfg.model_dump(), sets)
    asked = _progress_asked(args)
    res = reproduce(names, ctx, args.workers or os.cpu_count(), cached=args.cached, provenance=prov,
                    progress=True if asked is None else asked,
                    on_section=lambda sec: _print_section(sec, args.system, args.quick),
                    log=lambda line: Console().print(line, markup=False, highlight=False))  # wrapped to the width
    models = [str(m) for t in res.tables.values() if "model" in t for m in t["model"]]
    from cais.reproduce.experiments import EXPERIMENTS

    paper = any(EXPERIMENTS[n].paper for n in names)  # the warning is about the paper's numbers
    warning = quick_warning(args.quick and paper, list(dict.fromkeys(models)))
    if warning:
        Console().print(f"[bold yellow]Warning:[/] {warning}", highlight=False)
    Console().print(f"report: {res.report_md} and {res.report_html} (verdict, provenance, every figure; why we "
                    "differ from the paper: its last section); wall time "
                    f"{res.wall_s:.0f} s; per experiment, its runs added up: "
                    + ", ".join(f"{k} {v:.0f} s" for k, v in res.seconds.items()))


def _print_section(sec: Section, system: str, quick: bool) -> None:
    """An experiment's summary table and verdict, as soon as it is done."""
    from cais.reproduce.report import WHY_COLUMN, cell

    console = Console()
    df = sec.summary
    if sec.name == "fig11" and df is not None and not df.empty:
        t = Table(title=f"Fig. 11: CAIS's geomean speedup over each scheme on {system}"
                        + (" (quick grid)" if quick else ""))
        for col in ("mode", "scheme", "cais-sim", "paper", "cais-sim / paper"):
            t.add_column(col, justify="right")
        for r in df.itertuples():
            t.add_row(r.mode, r.scheme, f"{r.ours:.2f}x", "–" if r.paper != r.paper else f"{r.paper:.2f}x",
                      "–" if r.paper != r.paper else f"{r.ours / r.paper:.2f}")
        print_table(console, t)
        console.print("> 1: CAIS faster.")
    elif df is not None and not df.empty:
        t = Table(title=sec.title)
        cols = [c for c in df.columns if c != WHY_COLUMN]
        for col in cols:
            t.add_column(str(col), justify="right")
        for row in df[cols].itertuples(index=False):
            t.add_row(*(cell(v) for v in row))
        print_table(console, t)
        if df.attrs.get("caption"):
            console.print(str(df.attrs["caption"]), highlight=False)
    else:
        console.print(f"[bold]{sec.title}[/]", highlight=False)
    if not sec.lines:
        console.print("[bold]Verdict:[/] none (no runs to judge; see the report)", highlight=False)
    else:
        console.print("[bold]Verdict:[/]", highlight=False)
        for line in sec.lines:
            console.print(f"- {line}", highlight=False)


def _demo_layers(cfg: SystemConfig, model: ModelSpec) -> None:
    """Every scheme but the ablations on one prefill period of ``model`` at 66 SMs
    (the paper's setting)."""
    from cais.experiments.layer import run_layer
    from cais.schemes import schemes

    lt = Table(title=f"{model.name} prefill, one layer period, {cfg.gpus} GPUs x 66 SMs")
    for col in ("scheme", "total (us)", "L1 (us)", "L2 (us)", "speedup vs tp-nvls (>1: faster)", "link util"):
        lt.add_column(col, justify="right")
    base = None
    runs = {}
    for name, cls in schemes().items():
        if not cls().in_demo:
            continue
        r = runs[name] = run_layer(cfg, model, name, "prefill", 66)
        base = base or r.total_us
        lt.add_row(name, f"{r.total_us:,.0f}", f"{r.sublayers['L1']['time_us']:,.0f}",
                   f"{r.sublayers['L2']['time_us']:,.0f}", f"{base / r.total_us:.2f}x", f"{100 * r.link_util.mean:.0f} %")
    print_table(Console(), lt)
    Console().print(_slowest_line(runs, schemes()), highlight=False)
    for name in ("L1", "L2"):
        Console().print(f"{name}: {sublayer_legend(name, getattr(model, 'norm', 'rmsnorm'))}")
    _print_kv_note(model, cfg.gpus)
    Console().print("next: 'cais run --model paper-llama-7b --scheme cais --mode train --sms 66' for one scheme in "
                    "detail; 'cais schemes' lists the CAIS ablations; docs/validation.md compares with the paper")


def _slowest_line(runs: dict[str, Any], registry: dict[str, Any]) -> str:
    """One line on why the demo's slowest scheme is slow: what it does, and the bytes
    it sends per GPU over NVLink and its kernels' time beside the fastest scheme's."""
    def sent_gb(r: Any) -> float:
        per_gpu = [sum(d.values()) for d in r.metrics.wire_bytes.values()]
        return sum(per_gpu) / max(1, len(per_gpu)) / 1e9

    slow = max(runs, key=lambda n: runs[n].total_us)
    fast = min(runs, key=lambda n: runs[n].total_us)
    s, f = runs[slow], runs[fast]
    busy = s.kernel_us.get("computation", 0.0) + s.kernel_us.get("communication", 0.0)
    idle = (f"; its kernels run {busy:,.0f} us of its {s.total_us:,.0f} us period, the rest waiting"
            if busy < s.total_us else "")
    return (f"slowest: {slow} ({f.total_us / s.total_us:.2f}x the fastest, {fast}): {registry[slow].summary}; it "
            f"moves {sent_gb(s):.2f} GB per GPU over NVLink ({fast}: {sent_gb(f):.2f}){idle}")


def _set_option(sp: argparse.ArgumentParser, recorded: str = "--json records them under 'overrides'") -> None:
    """--set, its help naming only the flags ``sp`` has (added before it); ``recorded``:
    where the command's output records the values."""
    config = [f for f in ("--gpus", "--unit") if f in sp._option_string_actions]
    after = "--system" + (f" and the flags that set config ({', '.join(config)})" if config else "")
    sp.add_argument("--set", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                    help="set a system config field by its dotted path (e.g. link.bandwidth_GBps=50, "
                         "switch.links_per_gpu=[9,9], switch.model=nvls); repeatable. VALUE is read as JSON "
                         "where it parses, else as text, and validated like a system file; a section given as a JSON "
                         "object (gpu={\"sms\":66}) changes only the fields it names. Applied last: after "
                         f"{after}, so --set wins; a repeated key takes its last value. {recorded}")


def _output_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--trace", metavar="FILE.json", default=None,
                    help="write a timeline (Chrome Trace Event Format; open in ui.perfetto.dev or chrome://tracing): "
                         "per GPU its kernels, marks and TBs per SM; per switch chip link utilisation per port "
                         "and direction, buffer occupancy where ports have credits, and on CAIS switches the "
                         "data held in each port's merging table")
    sp.add_argument("--trace-tb-limit", type=_count, default=None, metavar="N",
                    help=f"most TB spans written one by one (default {DEFAULT_TB_LIMIT}); past it each kernel's "
                         "TBs are merged into one span per group of SMs (1, 2, 4, ... SMs, the smallest group "
                         "that fits), with the TB count and summed TB time as arguments")
    sp.add_argument("--trace-bin-us", type=_positive_float, default=None, metavar="US",
                    help="bin width of the trace's link, buffer and merge-table counters, in us "
                         f"(default {DEFAULT_BIN_PS / PS_PER_US:g})")
    sp.add_argument("--out", metavar="FILE.parquet|FILE.csv", default=None,
                    help="append one row for this run (every config field, the arguments and every metric, "
                         "nested keys dotted) to a Parquet or CSV table, chosen by the suffix")


def _sim_option(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--sim", choices=("full", "mirror"), default="full",
                    help="full: simulate every GPU (default); mirror: simulate GPU 0 only, the others as its "
                         "images, about GPUs x fewer events; only where every GPU runs GPU 0's program "
                         "(collectives; tp-nvls, sp-nvls), refused otherwise; within 3 %% of full on every case "
                         "checked (largest +2.95 %%: NVLS AllReduce on 32 GPUs of nvl72; ring identical; "
                         "docs/validation.md sections 10 and 14)")


def _launch_option(sp: argparse.ArgumentParser, what: str) -> None:
    sp.add_argument("--launch", choices=("fitted", "eager", "graph"), default=None,
                    help="how kernels reach the GPU, short for --set gpu.launch=...: fitted (the compute model's "
                         "fitted per-kernel overheads, the paper's runs), eager (host issue per op, the gap between "
                         "dependent kernels), graph (a CUDA-graph replay: the gap only, less with PDL); "
                         f"docs/compute-model.md, \"Launch modes\". {what}")


def _progress_option(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="a progress bar on stderr (simulated time, events, ETA) once a run passes 2 s; default: "
                         "shown when stderr is a terminal and --json is not given, unless the environment sets "
                         "CAIS_PROGRESS=0")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="cais", description="Simulate tensor-parallel LLM work on NVLink/NVSwitch systems.")
    p.add_argument("--version", action="version", version=f"{DISTRIBUTION} {__version__}",
                   help="print the installed version (cais-sim X.Y.Z) and exit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def with_system(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--system", default="dgx-h100",
                        help="preset name (see 'cais systems') or JSON file (default: %(default)s)")
        return sp

    c = with_system(sub.add_parser("collective", help="time one collective"))
    c.add_argument("--op", required=True, choices=OPS, help="the collective")
    c.add_argument("--algo", required=True, choices=("auto", *algorithm_names()),
                   help="ring: NCCL-style ring on SMs; nvls: NVLink SHARP; auto: NCCL's choice by size "
                        "(docs/fabric-model.md, \"Protocols\"); AllReduce only: custom-oneshot, custom-twoshot, "
                        "custom (vLLM's custom all-reduce, its path by size), multimem-oneshot, multimem-twoshot, "
                        "multimem (PyTorch symmetric memory), fused-oneshot, fused-twoshot, fused (TensorRT-LLM's "
                        "all-reduce fusion kernel without its norm); kernels/production_ar.py")
    c.add_argument("--protocol", choices=PROTOCOL_CHOICES, default="auto",
                   help="the ring's wire protocol: ll (flags in 16 B lines, half payload), ll128 (120 of 128 B), "
                        "simple (data, fence, flag); auto (default): NCCL's choice by size; NVLS runs simple")
    c.add_argument("--bytes", required=True, type=_size,
                   help="buffer size, e.g. 1G or 256M (nccl-tests convention: the full buffer)")
    c.add_argument("--gpus", type=_positive_int, default=None, help="GPUs taking part (default: the system's)")
    c.add_argument("--unit", type=_size, default=None,
                   help="transfer unit in bytes (default: the system's transfer_unit_bytes)")
    c.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    _sim_option(c)
    _set_option(c)
    _output_options(c)
    _progress_option(c)
    c.set_defaults(fn=cmd_collective)

    e = with_system(sub.add_parser("ep", help="time one expert-parallel dispatch or combine (docs/moe.md)"))
    e.add_argument("--kernel", required=True,
                   choices=("nccl", "allgather", "deepep", "deepep-ll", "ep-switch", "ep-switch-mcast",
                            "ep-switch-red", "ep-switch-unfused", "ep-switch-sw"),
                   help="nccl: NCCL all-to-all(v) after Megatron's permute; allgather: Megatron's all-gather "
                        "dispatcher; deepep / deepep-ll: DeepEP's normal and low-latency kernels; ep-switch*: "
                        "the in-switch family (multicast dispatch, in-switch combine, ablations, ep-switch-sw "
                        "its software counterpart; docs/moe.md)")
    e.add_argument("--op", required=True, choices=("dispatch", "combine"), help="the EP collective")
    e.add_argument("--tokens", required=True, type=_positive_int, help="tokens per rank")
    e.add_argument("--model", default=None,
                   help="a MoE preset or config.json (see 'cais models'): hidden, top-k, experts and routing groups")
    e.add_argument("--hidden", type=_positive_int, default=None, help="elements per token row (default: --model's)")
    e.add_argument("--topk", type=_positive_int, default=None, help="experts per token (default: --model's)")
    e.add_argument("--experts", type=_positive_int, default=None, help="routed experts in all (default: --model's)")
    e.add_argument("--gpus", type=_positive_int, default=None, help="EP ranks (default: the system's GPUs)")
    e.add_argument("--dtype", choices=("fp8", "bf16"), default="bf16",
                   help="dispatch payload (combine always BF16, as DeepEP runs it)")
    e.add_argument("--sms", type=_positive_int, default=None, help="DeepEP normal and ep-switch*: SMs (even; default 24)")
    e.add_argument("--chunk", type=_positive_int, default=None,
                   help="DeepEP normal: tokens per send round (default: its config, 6 dispatch / 4 combine); "
                        "ep-switch*: tokens per block of the fused pipeline")
    e.add_argument("--routing", choices=("uniform", "powerlaw", "lognormal", "balanced", "trace"), default="uniform",
                   help="uniform: top-k of |randn| (DeepEP's tests); powerlaw/lognormal expert popularity; balanced: "
                        "token t's j-th expert is (t + j) mod experts (with --topk 1 and one expert per GPU, "
                        "nccl-tests' alltoall); trace")
    e.add_argument("--alpha", type=float, default=1.0, help="powerlaw exponent")
    e.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma")
    e.add_argument("--trace", default=None, help="routing trace file (JSON topk_idx or .npy)")
    e.add_argument("--capacity-factor", type=float, default=None, help="expert capacity factor")
    e.add_argument("--capacity", choices=("none", "drop", "pad"), default="none", help="over capacity")
    e.add_argument("--seed", type=int, default=0, help="routing seed")
    e.add_argument("--host-sync", action="store_true", help="include the host wait for receive counts")
    e.add_argument("--functional", action="store_true", help="move real data and check a tiny MoE layer's output exactly (small shapes: each row meets an hidden x hidden matrix)")
    e.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    e.set_defaults(fn=cmd_ep)

    g = with_system(sub.add_parser("gemm", help="time one bf16 GEMM on one GPU"))
    g.add_argument("--m", required=True, type=_positive_int, help="rows of A and C")
    g.add_argument("--n", required=True, type=_positive_int, help="columns of B and C")
    g.add_argument("--k", required=True, type=_positive_int, help="the reduction dimension")
    g.add_argument("--sms", type=_positive_int, default=None, help="SMs to use (default: all of the GPU's)")
    g.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    _launch_option(g, "A published graph-mode (CUDA-graph) time is checked with --launch graph.")
    _set_option(g)
    g.set_defaults(fn=cmd_gemm)

    r = with_system(sub.add_parser("run", help="simulate one layer period of a model under a scheme"))
    r.add_argument("--model", required=True, help="preset (see 'cais models'), model JSON or HF config.json")
    r.add_argument("--scheme", required=True, help="see 'cais schemes'")
    r.add_argument("--mode", required=True, choices=("train", "prefill", "decode"),
                   help="train: forward + backward; prefill: forward over the prompt; decode: one token per sequence")
    r.add_argument("--sms", type=_positive_int, default=None,
                   help="SMs per GPU (default: all of the system's; the paper's scaled runs use 66)")
    r.add_argument("--gpus", type=_positive_int, default=None, help="TP degree (default: the system's GPU count)")
    r.add_argument("--batch", type=_positive_int, default=None, help="sequences (default: the model preset's)")
    r.add_argument("--seq", type=_positive_int, default=None, help="tokens per sequence (default: the model preset's)")
    r.add_argument("--attention", choices=("tp", "dp"), default=None,
                   help="a mixture-of-experts model's attention: tp (TP over the GPUs with sequence parallelism; "
                        "default) or dp (each GPU its own batch) (docs/moe.md)")
    r.add_argument("--expert-tp", type=_positive_int, default=None, metavar="N",
                   help="a mixture-of-experts model's expert tensor parallelism: each expert's FFN split over N GPUs, "
                        "EP over the GPUs / N (default 1; nccl, allgather and deepep kernels; docs/moe.md)")
    r.add_argument("--attention-tp", type=int, default=None, metavar="N",
                   help="a mixture-of-experts model's attention in TP groups of N GPUs (N divides the GPUs), each "
                        "group its own --batch sequences: N = GPUs is --attention tp, 1 is dp (docs/moe.md)")
    r.add_argument("--json", action="store_true", help="print the result (every metric) as JSON instead of a table")
    _sim_option(r)
    _launch_option(r, "Default: the system's (fitted on every preset); a --set gpu.launch wins")
    _set_option(r)
    _output_options(r)
    _progress_option(r)
    r.set_defaults(fn=cmd_run)

    w = sub.add_parser("sweep", help="run a grid of layer or collective points (docs/sweeps.md)")
    w.add_argument("spec", metavar="SPEC.yaml", help="the sweep: fixed, grid and points (docs/sweeps.md)")
    w.add_argument("--out", required=True, metavar="FILE.parquet|FILE.csv",
                   help="results table (Parquet or CSV, by the suffix): a row per point, appended as points "
                        "finish; rerun to resume")
    w.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                   help="local processes (default: CPUs; 1: in-process)")
    w.add_argument("--ray", metavar="ADDRESS", default=None, help="run on the Ray cluster at ADDRESS (host:port)")
    w.add_argument("--keep-errors", action="store_true", help="do not rerun points that failed before")
    w.add_argument("--no-progress", action="store_true", help="no progress bar")
    w.set_defaults(fn=cmd_sweep)

    s = sub.add_parser("systems", help="list system presets")
    s.set_defaults(fn=cmd_systems)
    sub.add_parser("schemes", help="list schemes").set_defaults(fn=cmd_schemes)
    sub.add_parser("models", help="list model presets").set_defaults(fn=cmd_models)

    d = with_system(sub.add_parser(
        "demo", help="the main job: NVLS and ring AllReduce, a GEMM, and every scheme (CAIS and the thirteen "
                     "baselines; not the ablations) on one prefill period of a model, as tables",
        description="The main job: NVLS and ring AllReduce checked in functional mode, a GEMM, and the scheme "
                    "comparison (CAIS and the thirteen baselines: the paper's nine and plain Megatron's tp-ring, "
                    "sp-ring, tp-nccl and sp-nccl) on one prefill period at 66 SMs, as tables."))
    d.add_argument("--bytes", type=_size, default=256 << 20, help="AllReduce buffer size (default: 256M)")
    d.add_argument("--model", default="paper-llama-7b", help="model of the scheme comparison (default: %(default)s)")
    d.set_defaults(fn=cmd_demo)

    rp = with_system(sub.add_parser(
        "reproduce", help="reproduce the paper's figures and tables (and studies past it): CSVs, PNGs, "
                          "report.md and report.html",
        description="Reproduce the CAIS paper's evaluation: each experiment writes DIR/NAME.csv and PNGs and a "
                    "section of DIR/report.md and DIR/report.html beside the paper's numbers (docs/reproduce.md)."))
    rp.add_argument("experiments", nargs="+", metavar="EXPERIMENT",
                    help="fig2 fig11 fig12 fig13 fig14 fig15 fig16 fig17 fig18 table2 (the paper's), map worlds "
                         "bound area cost full nvl72 decode production moe (past it), paper (the paper's set) or all")
    rp.add_argument("--quick", action="store_true", help="the reduced grids (minutes on 2 cores)")
    rp.add_argument("--out", required=True, metavar="DIR", help="folder for the CSVs, PNGs, runs and report")
    rp.add_argument("--models", nargs="+", default=None, metavar="MODEL",
                    help="replace the Fig. 11 grid's models (fig11, fig12, fig15, bound, worlds)")
    rp.add_argument("--modes", nargs="+", default=None, choices=("prefill", "train"),
                    help="replace the Fig. 11 grid's modes")
    rp.add_argument("--workers", type=_positive_int, default=None,
                    help="local worker processes for the runs (default: the CPU count)")
    rp.add_argument("--cached", action="store_true",
                    help="simulate nothing: analyse only the runs already in DIR/runs (others are left out)")
    _launch_option(rp, "Default: each experiment's own (production: decode under graphs, prefill eager; the "
                       "paper's experiments fitted); given, every point runs it; a --set gpu.launch wins")
    _set_option(rp, "The report's provenance and every CSV row record them")
    rp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="the runs' progress on stderr (a bar on a terminal, a line now and then elsewhere); "
                         "default: shown, unless the environment sets CAIS_PROGRESS=0")
    rp.set_defaults(fn=cmd_reproduce)
    for sp in sub.choices.values():  # each command's option strings, for as_flags
        sp.set_defaults(options=frozenset(sp._option_string_actions))
    return p


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "(no message)"


def _stdout_closed() -> int:
    """Exit code 141 for a stdout closed early (``cais models | head -1``), as a
    process killed by SIGPIPE reports it in a shell, with nothing on stderr."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the final flush goes nowhere
    except (OSError, ValueError):  # no stdout file descriptor (an embedding, a test's capture)
        pass
    return 141


class Terminated(KeyboardInterrupt):
    """The process was asked to end (SIGTERM, as ``kill`` and batch schedulers send):
    it stops as on Ctrl-C, so the workers of a sweep are ended with it."""


def _terminate(signum: int, frame: object) -> NoReturn:
    raise Terminated


def _stopped(code: int, argv: Sequence[str] | None) -> int:
    """The exit code of a command stopped half-way; in the command line's own process
    what it leaves is frozen out of the interpreter's collection at exit. A run
    stopped mid-flight leaves a machine full of trains and requests in reference
    cycles, and walking it at exit took longer than the run had (20 s after Ctrl-C on
    a 6 MiB NVLS AllReduce on 72 GPUs of ``nvl72``; docs/core.md): the process ends,
    so nothing needs freeing. A caller's process (``argv`` given) is left as it is."""
    if argv is None:
        gc.freeze()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; the exit code: 0 done, 2 a user's mistake (one line
    ``cais: error: ...``), 3 the simulated system stalled, 1 a bug in the simulator
    (one line ``cais: internal error: ...``; ``CAIS_DEBUG=1`` raises it with its
    traceback instead), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM), 141
    stdout closed early. On a user's mistake nothing is printed on stdout and no
    result file is written. ``cais`` alone prints the help on stdout (exit 0).
    docs/errors.md."""
    if argv is None:  # the command line's process: SIGTERM stops it cleanly, as Ctrl-C does
        signal.signal(signal.SIGTERM, _terminate)
    parser = build_parser()
    try:
        if not (sys.argv[1:] if argv is None else argv):  # bare ``cais``: the help, as ``cais --help``
            parser.print_help()
            sys.stdout.flush()
            return 0
        try:
            args = parser.parse_args(argv)
        except SystemExit:  # --help, --version or a usage error: what they printed goes out now
            sys.stdout.flush()
            raise
    except BrokenPipeError:
        return _stdout_closed()
    args.command_line = shlex.join(["cais", *(sys.argv[1:] if argv is None else argv)])
    if getattr(args, "launch", None):  # --launch X is --set gpu.launch=X, before the --set values (they win)
        args.set = [("gpu.launch", args.launch), *args.set]
    try:
        args.fn(args)
        sys.stdout.flush()  # a closed stdout is found here, not at the interpreter's exit
    except UserError as exc:
        message = _one_line(str(exc))
        if not isinstance(exc, UsageError):  # a library message names parameters; show them as flags
            message = as_flags(message, getattr(args, "options", ()))
        print(f"cais: error: {message}", file=sys.stderr)
        return 2
    except Stalled as exc:  # the simulated system stopped making progress: a result, not a crash
        print(f"cais: stalled: {_one_line(str(exc))}", file=sys.stderr)
        return 3
    except Terminated:
        print("cais: terminated", file=sys.stderr)
        return _stopped(143, argv)
    except KeyboardInterrupt:
        print("cais: interrupted", file=sys.stderr)
        return _stopped(130, argv)
    except BrokenPipeError:  # stdout closed early (``cais models | head -1``): stop quietly, as on SIGPIPE
        return _stdout_closed()
    except Exception as exc:  # noqa: BLE001 - anything else is a bug; say so in one line
        if os.environ.get("CAIS_DEBUG"):
            raise
        print(f"cais: internal error: {type(exc).__name__}: {_one_line(str(exc))} (please report this with the "
              "command you ran; CAIS_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
