"""The whole decode step per output token (``token_us``, experiments/token.py) against
the published per-token latencies in src/cais/data/published/decode_token.csv: one
Markdown row per CSV row with the published time, ours, ours / published, the signed
error and, beside it, where our time goes (the layers at the simulated period with the
period's segments, and the step's tail outside the layers). Rows the simulator cannot
run or whose harness is not a decode step (``use`` unscored) are listed, not scored;
the scored rows are ``fit`` (the Llama-3-70B row: ``gpu.kernel_gap_us`` is chosen on
it, scripts/fit_production.py) or ``held-out`` (never used to choose a value).

Ours is ``cais run --mode decode --launch graph`` with the row's model, GPUs and batch,
the KV cache at the prompt plus half the output (the middle of the timed steps), under
the scheme of the stack the row's harness ran (its ``scheme`` column: vLLM 0.6 and
SGLang 0.2-0.3 ran vLLM's custom all-reduce and a separate residual-add + RMSNorm
kernel, ``tp-custom-ar``; today's vLLM fuses the two, ``tp-vllm``), on the row's
system (docs/validation.md, "The decode step against published per-token latencies").
Under the table: the scored rows' mean |error| and signed bias, the gap spread over the
layers, the same steps with every GEMM data-parallel, and with ``gpu.kernel_gap_us``
at each end of its sourced range.

    .venv/bin/python scripts/validate_token.py
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cais.config import apply_overrides, load_system
from cais.experiments.layer import LayerResult, run_layer
from cais.reproduce.experiments.production import LAUNCH_CONSTANTS
from cais.workload.models import load_model

CSV = Path(__file__).resolve().parents[1] / "src/cais/data/published/decode_token.csv"
COLUMNS = ("model", "gpus", "system", "batch", "prompt", "output", "dtype", "stack", "scheme", "launch", "sets",
           "time_us", "what", "use", "source", "note")
#: fit: the row gpu.kernel_gap_us is chosen on (scripts/fit_production.py); held-out:
#: never used to choose a value; unscored: listed beside them, the note says why
USES = ("fit", "held-out", "unscored")
SCORED = ("fit", "held-out")


@dataclass(frozen=True)
class TokenRow:
    """One published per-token latency: the model, the TP group, the batch, the prompt
    and output lengths, the stack and its launch mode, the time and what it includes."""

    model: str
    gpus: int
    system: str
    batch: int
    prompt: int
    output: int
    dtype: str
    stack: str
    scheme: str
    launch: str
    sets: str
    time_us: float
    what: str
    use: str
    source: str
    note: str

    @property
    def overrides(self) -> dict[str, str]:
        """The settings that stand for the stack's own decode step (its ``sets`` column,
        ``key=value`` pairs separated by ``;``: vLLM 0.6's rows ``decode.stack=vllm-0.6``)."""
        pairs = [p.split("=", 1) for p in self.sets.split(";") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise ValueError(f"sets '{self.sets}': expected key=value pairs separated by ';'")
        return {k.strip(): v.strip() for k, v in pairs}

    @property
    def kv(self) -> int:
        """The KV cache in the middle of the timed steps."""
        return self.prompt + self.output // 2


#: the columns read as numbers; the rest are text
NUMBERS = {"gpus": int, "batch": int, "prompt": int, "output": int, "time_us": float}


def rows(path: Path = CSV) -> list[TokenRow]:
    """The CSV's rows, checked: every column, a known use, a source, a note."""
    with path.open(newline="") as f:
        raw = list(csv.DictReader(f))
    if not raw or tuple(raw[0]) != COLUMNS:
        raise ValueError(f"{path.name}: no rows, or columns other than {list(COLUMNS)}")
    for i, r in enumerate(raw):
        if r["use"] not in USES or not r["source"].strip() or not r["note"].strip():
            raise ValueError(f"{path.name} row {i}: use '{r['use']}' (expected {USES}), a source and a note")
    return [TokenRow(**{k: NUMBERS.get(k, str)(r[k]) for k in COLUMNS}) for r in raw]


def ours(row: TokenRow, split: bool = True, sets: Mapping[str, object] | None = None) -> LayerResult:
    """Our decode step for ``row`` under the stack its harness ran (its ``token`` is the
    time per output token); ``split`` False runs every GEMM data-parallel
    (``gpu.split_gemms=false``); ``sets``: further overrides (key -> value)."""
    pairs = {"gpu.launch": row.launch, **row.overrides, **{k: str(v) for k, v in (sets or {}).items()}}
    if not split:
        pairs["gpu.split_gemms"] = "false"
    cfg = apply_overrides(load_system(row.system, gpus=row.gpus), pairs)
    return run_layer(cfg, load_model(row.model).with_run(row.batch, row.kv), row.scheme, "decode", cfg.gpu.sms)


def short(row: TokenRow) -> str:
    """A scored row's name in the lines under the table: its model and batch."""
    return f"{row.model} batch {row.batch}"


def runnable(row: TokenRow) -> bool:
    return row.gpus >= 2


def breakdown(r: LayerResult) -> str:
    """Where the step's time goes: layers x period (the period's segments), then the tail."""
    t = r.token
    assert t is not None
    seg = ", ".join(f"{k} {v:.1f}" for k, v in r.segments.items())
    tail = ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in t.tail.items())
    return f"{t.layers} x {t.layer_us:.1f} ({seg}) + tail {t.tail_us:.1f} ({tail})"


def label(source: str) -> str:
    """A short name for a row's source: its words before the first parenthesis, a
    repository's file shown as the repository's name and the file's name."""
    head = source.split(" (", 1)[0].replace("sgl-project/", "")
    repo, _, path = head.partition(" ")
    if "/" in repo and "/" in path and " " not in path:
        return f"{repo.rsplit('/', 1)[-1]} {path.rsplit('/', 1)[-1]}"
    return head


def table(selected: list[TokenRow], results: list[LayerResult | None]) -> str:
    lines = ["| use | model | GPUs | batch | KV | stack | published (us) | ours (us) | ours / published | error | "
             "ours: layers x period (segments) + tail (us) | source |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|---|"]
    for row, r in zip(selected, results):
        src = label(row.source)
        if r is None or r.token is None:
            lines.append(f"| {row.use} | {row.model} | {row.gpus} | {row.batch} | {row.kv:,} | {row.stack} | "
                         f"{row.time_us:,.0f} | - | - | - | not run (TP {row.gpus}) | {src} |")
            continue
        t = r.token.token_us
        lines.append(f"| {row.use} | {row.model} | {row.gpus} | {row.batch} | {row.kv:,} | {row.stack} | "
                     f"{row.time_us:,.0f} | {t:,.0f} | {t / row.time_us:.2f} | {100 * (t / row.time_us - 1):+.0f} % | "
                     f"{breakdown(r)} | {src} |")
    return "\n".join(lines)


def growth_split(scored: list[tuple[TokenRow, LayerResult]]) -> str | None:
    """How the step grows from batch 1 to each model's largest scored batch, split over
    two models with different layer counts as ``a + layers x b`` (``a`` per token, ``b``
    per layer), published and ours: which kind of cost the larger batches add. None
    unless exactly two models have both a batch-1 and a larger scored row."""
    growth: dict[str, tuple[int, float, float]] = {}  # model -> (layers, published, ours)
    for model in sorted({row.model for row, _ in scored}):
        rows_ = sorted(((row, r) for row, r in scored if row.model == model and r.token), key=lambda x: x[0].batch)
        if len(rows_) < 2 or rows_[0][0].batch != 1:
            continue
        (r1, o1), (rb, ob) = rows_[0], rows_[-1]
        assert o1.token is not None and ob.token is not None
        growth[model] = (o1.token.layers, rb.time_us - r1.time_us, ob.token.token_us - o1.token.token_us)
    if len(growth) != 2:
        return None
    (m1, (l1, p1, o1_)), (m2, (l2, p2, o2_)) = sorted(growth.items(), key=lambda kv: kv[1][0])
    if l1 == l2:
        return None
    parts = []
    for what, g1, g2 in (("published", p1, p2), ("ours", o1_, o2_)):
        b = (g2 - g1) / (l2 - l1)
        parts.append(f"{what} a {g1 - l1 * b:+,.0f} us, b {b:+.1f} us per layer")
    return (f"growth from batch 1 to the largest scored batch ({m1} {p1:+,.0f} / ours {o1_:+,.0f} us, "
            f"{m2} {p2:+,.0f} / ours {o2_:+,.0f} us) as a + layers x b: " + "; ".join(parts))


def main() -> None:
    every = rows()
    results = [ours(r) if runnable(r) else None for r in every]
    print(table(every, results))
    scored = [(row, r) for row, r in zip(every, results) if row.use in SCORED and r is not None and r.token]
    if scored:
        print()
        for name, sel in [(u, [(row, r) for row, r in scored if row.use == u]) for u in SCORED] + [("scored", scored)]:
            if not sel:
                continue
            signed = [r.token.token_us / row.time_us - 1 for row, r in sel if r.token]
            print(f"{name} rows: {len(sel)}, mean |error| {100 * sum(map(abs, signed)) / len(signed):.1f} %, "
                  f"signed bias {100 * sum(signed) / len(signed):+.1f} %")
        gaps = [f"{short(row)} {(row.time_us - r.token.token_us) / r.token.layers:+.1f} us"
                for row, r in scored if r.token]
        print(f"(published - ours) / layers, each scored row: {', '.join(gaps)}")
        split = growth_split(scored)
        if split is not None:
            print(split)
        low, high = LAUNCH_CONSTANTS["gpu.kernel_gap_us"]
        for what, kw in (("every GEMM data-parallel (gpu.split_gemms=false)", {"split": False}),
                         (f"gpu.kernel_gap_us at its sourced range's low end ({low:g} us)",
                          {"sets": {"gpu.kernel_gap_us": low}}),
                         (f"gpu.kernel_gap_us at its sourced range's high end ({high:g} us)",
                          {"sets": {"gpu.kernel_gap_us": high}})):
            alt = []
            for row, _ in scored:
                t = ours(row, **kw).token  # type: ignore[arg-type]
                assert t is not None
                alt.append(f"{short(row)} {t.token_us:,.0f} us ({100 * (t.token_us / row.time_us - 1):+.0f} %)")
            print(f"the same with {what}: {', '.join(alt)}")


if __name__ == "__main__":
    main()
