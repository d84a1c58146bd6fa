"""Bad inputs through the real command line: every one ends within a time limit with
exit code 2, exactly one line on stderr (``cais: error: ...``), nothing on stdout, and
no result file (or temporary file) left behind (docs/errors.md).

The cases run as subprocesses, in parallel threads, once per module; each test then
checks one case."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from cais.config import load_system
from cli_harness import TIME_LIMIT_S, Outcome, cais_env, files_of, run_cais



def _system_dump(**changes: object) -> dict:
    data = load_system("dgx-h100").model_dump(mode="json")
    data.update(changes)
    return data


def _without(key: str) -> dict:
    data = _system_dump(name="partial")
    del data[key]
    return data


def _write(name: str, content: object) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return setup


def _mkdir(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).mkdir()


@dataclass
class Case:
    id: str
    args: list[str]  # "{d}" is the case's own directory
    says: str  # a piece of the one stderr line
    outputs: bool = True  # also pass --out/--trace in {d} (collective and run) and check they are not written
    setup: Callable[[Path], None] | None = None
    env: dict[str, str] = field(default_factory=dict)


COLL = ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "64K"]
RUN = ["run", "--model", "paper-mega-gpt-4b", "--scheme", "tp-nvls", "--mode", "prefill"]
GEMM = ["gemm", "--m", "256", "--n", "256", "--k", "256"]
LLAMA_HF = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
            "hidden_act": "silu"}  # no num_attention_heads
MODEL = {"name": "mine", "family": "gpt", "hidden": 1536, "ffn_hidden": 6144, "heads": 12, "layers": 4,
         "gated_mlp": False, "norm": "layernorm", "activation": "gelu", "seq": 512, "batch": 8}

CASES = [
    # unknown names
    Case("unknown-command", ["simulate"], "invalid choice"),
    Case("unknown-scheme", [*RUN[:4], "nccl", *RUN[5:]], "--scheme: unknown scheme 'nccl'"),
    Case("unknown-model", ["run", "--model", "gpt5", "--scheme", "tp-nvls", "--mode", "train"], "--model: unknown"),
    Case("unknown-model-lists-moe", ["run", "--model", "gpt5", "--scheme", "ep-deepep", "--mode", "train"],
         "MoE: deepseek-v3, mixtral-8x7b, qwen3-30b-a3b"),
    Case("ep-functional-too-wide", ["ep", "--kernel", "deepep", "--op", "dispatch", "--tokens", "8", "--hidden",
                                    "99968", "--topk", "2", "--experts", "16", "--functional"],
         "--hidden: functional mode's 16 experts"),
    Case("unknown-system", [*COLL, "--system", "dgx-a100"], "--system: unknown system 'dgx-a100'"),
    Case("unknown-op", ["collective", "--op", "alltoall", "--algo", "nvls", "--bytes", "1M"], "--op"),
    Case("unknown-algo", ["collective", "--op", "allreduce", "--algo", "tree", "--bytes", "1M"], "--algo"),
    Case("unknown-mode", [*RUN[:6], "serve"], "--mode"),
    Case("unknown-switch-model", [*COLL, "--set", "switch.model=nvswitch9"], "switch.model"),
    Case("unknown-system-for-gemm", [*GEMM, "--system", "tpu-pod"], "--system: unknown system"),
    Case("unknown-demo-model", ["demo", "--model", "nosuch"], "--model: unknown model 'nosuch'"),
    # bad numbers
    Case("negative-bytes", ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes=-1M"], "--bytes"),
    Case("zero-bytes", ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "0"], "--bytes"),
    Case("non-numeric-bytes", ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "lots"], "--bytes"),
    Case("odd-bytes", ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "3"], "multiple of 2"),
    Case("infinite-bytes", ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "inf"], "--bytes"),
    Case("nan-bytes", ["collective", "--op", "allreduce", "--algo", "ring", "--bytes", "nan"], "--bytes"),
    Case("zero-m", ["gemm", "--m", "0", "--n", "1", "--k", "1"], "--m"),
    Case("fractional-m", ["gemm", "--m", "1.5", "--n", "8", "--k", "8"], "--m"),
    Case("too-many-sms", [*GEMM, "--sms", "1000"], "--sms"),
    Case("zero-sms", [*RUN, "--sms", "0"], "--sms"),
    Case("one-gpu", [*RUN, "--gpus", "1"], "gpus"),
    Case("zero-batch", [*RUN, "--batch", "0"], "--batch"),
    Case("non-numeric-seq", [*RUN, "--seq", "long"], "--seq"),
    Case("unit-below-a-packet", [*COLL, "--unit", "100"], "transfer_unit_bytes"),
    Case("unit-not-whole-packets", [*COLL, "--unit", "1000"], "multiple of packet.max_payload_bytes"),
    Case("zero-trace-bin", [*COLL, "--trace-bin-us", "0"], "--trace-bin-us"),
    Case("negative-tb-limit", [*COLL, "--trace-tb-limit", "-1"], "--trace-tb-limit"),
    Case("bad-env-limit", COLL, "CAIS_MAX_EVENTS", env={"CAIS_MAX_EVENTS": "lots"}),
    # absurd sizes: refused from the estimate at once, not run
    Case("huge-collective", ["collective", "--op", "allreduce", "--algo", "ring", "--bytes", "1e20"],
         "beyond the limit"),
    Case("huge-gemm", ["gemm", "--m", "100000000", "--n", "100000", "--k", "4096"], "beyond the limit"),
    Case("gemm-past-32-bit", ["gemm", "--m", "128", "--n", "128", "--k", "100000000000000000000"], "32-bit"),
    Case("huge-batch", [*RUN[:6], "train", "--batch", "1000000"], "beyond the limit"),
    Case("huge-seq", [*RUN[:4], "cais", "--mode", "prefill", "--seq", "100000000"], "beyond the limit"),
    Case("huge-gpu-count", [*COLL, "--system", "h100-nvswitch", "--gpus", "1000000"], "beyond the limit"),
    Case("huge-demo-bytes", ["demo", "--bytes", "1000G"], "beyond the limit"),
    Case("huge-vc-count", [*COLL, "--set", "link.vcs=100000000"], "link.vcs"),
    Case("huge-sm-count", [*RUN, "--set", "gpu.sms=100000000"], "gpu.sms"),
    Case("huge-channel-count", [*COLL, "--set", "collective.nvls_channels=100000000"], "channels"),
    # --set keys and values
    Case("set-unknown-key", [*COLL, "--set", "link.speed=50"], "unknown key 'link.speed'"),
    Case("set-negative", [*COLL, "--set", "link.bandwidth_GBps=-5"], "link.bandwidth_GBps"),
    Case("set-wrong-type", [*COLL, "--set", "link.bandwidth_GBps=fast"], "link.bandwidth_GBps"),
    Case("set-without-value", [*COLL, "--set", "gpu.sms"], "KEY=VALUE"),
    Case("set-below-a-value", [*COLL, "--set", "link.latency_ns.max=1"], "is a value"),
    Case("set-links-mismatch", [*COLL, "--set", "switch.links_per_gpu=[5,4]"], "links_per_gpu"),
    Case("set-more-gpus", [*COLL, "--set", "gpus=16"], "not scalable"),
    # GPU counts and tensor parallelism
    Case("more-gpus-than-the-machine", [*COLL, "--gpus", "16"], "has 8 GPUs and is not scalable"),
    Case("heads-not-divisible", ["run", "--model", "paper-llama-7b", *RUN[3:], "--gpus", "3"],
         "TP=3 does not divide heads 32"),
    Case("model-file-heads-not-divisible", [*RUN[:2], "{d}/m.json", *RUN[3:], "--gpus", "8"],
         "TP=8 does not divide heads 12", setup=_write("m.json", MODEL)),
    Case("demo-on-a-rack-the-model-does-not-split-over", ["demo", "--system", "nvl72", "--bytes", "1M"],
         "TP=72 does not divide"),
    # files
    Case("system-file-not-found", [*COLL, "--system", "{d}/nosuch.json"], "file not found"),
    Case("system-file-is-a-directory", [*COLL, "--system", "{d}/sys.json"], "is a directory",
         setup=_mkdir("sys.json")),
    Case("system-file-not-json", [*COLL, "--system", "{d}/s.json"], "not valid JSON",
         setup=_write("s.json", "{gpus: 8")),
    Case("system-file-not-an-object", [*COLL, "--system", "{d}/s.json"], "expected a JSON object",
         setup=_write("s.json", [1, 2, 3])),
    Case("system-file-name-only", [*COLL, "--system", "{d}/s.json"], "missing field 'description'",
         setup=_write("s.json", {"name": "x"})),
    Case("system-file-without-a-section", [*COLL, "--system", "{d}/s.json"], "missing field 'cais'",
         setup=_write("s.json", _without("cais"))),
    Case("system-file-without-a-nested-field", [*COLL, "--system", "{d}/s.json"], "missing field 'switch.merge'",
         setup=_write("s.json", _system_dump(switch={k: v for k, v in _system_dump()["switch"].items()
                                                     if k != "merge"}))),
    Case("system-file-bad-type", [*COLL, "--system", "{d}/s.json"], "link.bandwidth_GBps",
         setup=_write("s.json", {"base": "dgx-h100", "link": {"bandwidth_GBps": "fast"}})),
    Case("system-file-unknown-field", [*COLL, "--system", "{d}/s.json"], "unknown field 'link.speed'",
         setup=_write("s.json", {"base": "dgx-h100", "link": {"speed": 50}})),
    Case("system-file-unknown-base", [*COLL, "--system", "{d}/s.json"], "field 'base'",
         setup=_write("s.json", {"base": "dgx-a100"})),
    Case("model-file-not-found", ["run", "--model", "{d}/nosuch.json", *RUN[3:]], "file not found"),
    Case("model-file-not-an-object", ["run", "--model", "{d}/m.json", *RUN[3:]], "expected a JSON object",
         setup=_write("m.json", "[]")),
    Case("model-file-bad-type", ["run", "--model", "{d}/m.json", *RUN[3:]], "field 'hidden'",
         setup=_write("m.json", {**MODEL, "hidden": "big"})),
    Case("hf-config-missing-key", ["run", "--model", "{d}/config.json", *RUN[3:]],
         "missing key 'num_attention_heads'", setup=_write("config.json", LLAMA_HF)),
    # outputs and conflicting options
    Case("out-directory-missing", [*COLL, "--out", "{d}/no/such/dir/runs.csv"], "--out: no directory",
         outputs=False),
    Case("out-unknown-extension", [*COLL, "--out", "{d}/runs.xlsx"], ".parquet", outputs=False),
    Case("trace-unknown-extension", [*COLL, "--trace", "{d}/trace.txt"], "--trace", outputs=False),
    Case("trace-is-a-directory", [*COLL, "--trace", "{d}/t.json"], "is a directory", outputs=False,
         setup=_mkdir("t.json")),
    Case("tb-limit-without-trace", [*COLL, "--trace-tb-limit", "10"], "give --trace", outputs=False),
    Case("trace-bin-without-trace", [*RUN, "--trace-bin-us", "1"], "give --trace", outputs=False),
    Case("missing-required-option", ["collective", "--op", "allreduce", "--bytes", "1M"], "--algo"),
    # found only after the run: the outputs must still not appear
    Case("trace-bin-too-fine-after-the-run", [*COLL, "--trace-bin-us", "1e-9"], "--trace-bin-us"),
    Case("out-not-a-table-after-the-run", [*COLL, "--trace", "{d}/t.json", "--out", "{d}/old.parquet"],
         "--out: cannot append", outputs=False, setup=_write("old.parquet", "not parquet")),
]


def _run(case: Case, root: Path) -> Outcome:
    d = root / case.id
    d.mkdir()
    if case.setup:
        case.setup(d)
    args = [a.replace("{d}", str(d)) for a in case.args]
    if case.outputs and args[:1] in (["collective"], ["run"]):
        args += ["--out", str(d / "runs.parquet"), "--trace", str(d / "trace.json")]
    before = files_of(d)
    proc = run_cais(args, cais_env(case.env))
    return Outcome(case, d, before, proc, timed_out=proc is None)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("bad_inputs")
    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as pool:
        return {o.case.id: o for o in pool.map(lambda c: _run(c, root), CASES)}


def test_the_cases_are_many_and_distinct() -> None:
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_input_is_one_line_exit_2_and_leaves_nothing(case: Case, outcomes: dict[str, Outcome]) -> None:
    o = outcomes[case.id]
    assert not o.timed_out, f"no answer within {TIME_LIMIT_S} s"
    assert o.proc is not None
    lines = o.proc.stderr.splitlines()
    assert o.proc.returncode == 2, o.proc.stderr
    assert len(lines) == 1, o.proc.stderr
    assert lines[0].startswith("cais: error: ") and case.says in lines[0], lines[0]
    assert o.proc.stdout == ""
    assert files_of(o.dir) == o.before  # no output, no temporary file, inputs untouched
