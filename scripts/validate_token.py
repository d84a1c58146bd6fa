"""The whole decode step per output token (``token_us``, experiments/token.py) against
the published per-token latencies in src/cais/data/published/decode_token.csv: one
Markdown row per CSV row with the published time, ours, ours / published, the signed
error and, beside it, where our time goes (the layers at the simulated period with the
period's segments, and the step's tail outside the layers). Rows the simulator cannot
run or whose harness is not a decode step (``use`` unscored) are listed, not scored.

Ours is ``cais run --mode decode --launch graph`` with the row's model, GPUs and batch,
the KV cache at the prompt plus half the output (the middle of the timed steps), under
vLLM's all-reduce (``tp-vllm``: SGLang's TP all-reduce is the same kernel), on the
row's system (docs/validation.md, "The decode step against published per-token
latencies"). Under the table: the scored rows' mean |error| and signed bias, the gap
spread over the layers, and the same steps with every GEMM data-parallel.

    .venv/bin/python scripts/validate_token.py
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from cais.config import apply_overrides, load_system
from cais.experiments.layer import LayerResult, run_layer
from cais.workload.models import load_model

CSV = Path(__file__).resolve().parents[1] / "src/cais/data/published/decode_token.csv"
COLUMNS = ("model", "gpus", "system", "batch", "prompt", "output", "dtype", "stack", "launch", "time_us", "what",
           "use", "source", "note")
USES = ("scored", "unscored")
SCHEME = "tp-vllm"


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
    launch: str
    time_us: float
    what: str
    use: str
    source: str
    note: str

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


def ours(model: str, gpus: int, system: str, batch: int, kv: int, launch: str = "graph",
         split: bool = True) -> LayerResult:
    """Our decode step (its ``token`` is the time per output token); ``split`` False runs
    every GEMM data-parallel (``gpu.split_gemms=false``)."""
    sets = {"gpu.launch": launch} if split else {"gpu.launch": launch, "gpu.split_gemms": "false"}
    cfg = apply_overrides(load_system(system, gpus=gpus), sets)
    return run_layer(cfg, load_model(model).with_run(batch, kv), SCHEME, "decode", cfg.gpu.sms)


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


def main() -> None:
    every = rows()
    results = [ours(r.model, r.gpus, r.system, r.batch, r.kv, r.launch) if runnable(r) else None for r in every]
    print(table(every, results))
    scored = [(row, r) for row, r in zip(every, results) if row.use == "scored" and r is not None and r.token]
    if scored:
        errs = [abs(r.token.token_us / row.time_us - 1) for row, r in scored if r.token]
        signed = [r.token.token_us / row.time_us - 1 for row, r in scored if r.token]
        print(f"\nscored rows: {len(scored)}, mean |error| {100 * sum(errs) / len(errs):.0f} %, "
              f"signed bias {100 * sum(signed) / len(signed):+.0f} %")
        gaps = [f"{row.model} {(row.time_us - r.token.token_us) / r.token.layers:+.1f} us"
                for row, r in scored if r.token]
        print(f"(published - ours) / layers, each scored row: {', '.join(gaps)}")
        whole = []
        for row, _ in scored:
            t = ours(row.model, row.gpus, row.system, row.batch, row.kv, row.launch, split=False).token
            assert t is not None
            whole.append(f"{row.model} {t.token_us:,.0f} us ({100 * (t.token_us / row.time_us - 1):+.0f} %)")
        print(f"the same with every GEMM data-parallel (gpu.split_gemms=false): {', '.join(whole)}")


if __name__ == "__main__":
    main()
