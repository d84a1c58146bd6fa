"""The EP kernels' send loops run in the core in timing mode (cais._core.StoreChains for
DeepEP's normal senders, cais._core.CopyLoop for the copy loop of NCCL's channels and
DeepEP's low-latency senders). They must time exactly what the kernels' Python loops,
which functional mode still runs, time: same simulated time, same events, every
protocol and part count the loops take (plain, LL and Simple stores; FP8 rows with
their scales; chunks to the sender's own GPU)."""

from __future__ import annotations

from collections import Counter
from functools import partial

import pytest

from cais.config import load_system
from cais.experiments.ep import run_ep
from cais.isa import Isa
from cais.kernels import ep_common, ep_deepep, ep_deepep_ll, ep_nccl


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts what the compiled loops are handed: loops started, chunks and moves by
    protocol (the paths taken)."""
    seen: Counter = Counter()
    chains, loop = Isa.store_chains, Isa.copy_loop

    def store_chains(self, src, chain_list, port):
        seen["store_chains"] += 1
        for dst, _, chunks in chain_list:
            seen["local chunk" if dst == src else "remote chunk"] += len(chunks)
            seen["two-part chunk"] += sum(len(parts) == 2 for parts, _, _ in chunks)
        return chains(self, src, chain_list, port)

    def copy_loop(self, src, moves, *args):
        seen["copy_loop"] += 1
        for _, protocol, parts, _, _ in moves:
            seen[protocol] += 1
            seen["two-part move"] += len(parts) == 2
        return loop(self, src, moves, *args)

    monkeypatch.setattr(Isa, "store_chains", store_chains)
    monkeypatch.setattr(Isa, "copy_loop", copy_loop)
    return seen


def python_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels' send loops in Python (as functional mode runs them)."""
    monkeypatch.setattr(ep_deepep, "_sender", partial(ep_deepep._sender, compiled_loop=False))
    for mod in (ep_deepep_ll, ep_nccl):
        monkeypatch.setattr(mod, "copy_tb", partial(ep_common.copy_tb, compiled_loop=False))


CASES = [  # kernel, op, dtype, tokens per rank, GPUs
    ("deepep", "dispatch", "fp8", 96, 8),
    ("deepep", "combine", "bf16", 96, 8),
    ("deepep", "dispatch", "bf16", 64, 2),
    ("deepep-ll", "dispatch", "fp8", 32, 8),
    ("deepep-ll", "combine", "bf16", 32, 8),
    ("nccl", "dispatch", "bf16", 4, 8),
    ("nccl", "dispatch", "bf16", 512, 8),
    ("nccl", "combine", "fp8", 512, 4),
]


@pytest.mark.parametrize("kernel,op,dtype,tokens,gpus", CASES)
def test_compiled_loop_times_as_python_loop(kernel, op, dtype, tokens, gpus, spy, monkeypatch):
    cfg = load_system("dgx-h100", gpus=gpus)
    run = partial(run_ep, cfg, kernel, op, tokens, 2048, 8, 64, dtype=dtype, seed=3)
    compiled = run()
    started = spy["store_chains"] + spy["copy_loop"]
    assert started > 0, "the compiled loops were not used in timing mode"
    python_loops(monkeypatch)
    python = run()
    assert spy["store_chains"] + spy["copy_loop"] == started, "the Python loops called the compiled ones"
    assert compiled.events > 0
    assert (compiled.time_us, compiled.events) == (python.time_us, python.events)
    assert compiled.bytes_counted == python.bytes_counted


def test_cases_take_every_path(spy):
    """The cases above reach every branch of both compiled loops."""
    for kernel, op, dtype, tokens, gpus in CASES:
        run_ep(load_system("dgx-h100", gpus=gpus), kernel, op, tokens, 2048, 8, 64, dtype=dtype, seed=3)
    for path in ("local chunk", "remote chunk", "two-part chunk", "plain", "ll", "simple", "local", "two-part move"):
        assert spy[path] > 0, f"no case takes the {path!r} path"


def test_functional_mode_keeps_the_python_loops(spy):
    """Functional mode carries the rows' data, so its check never uses the compiled
    loops (a functional run_ep then times the call as a timing run does), and its data
    arrive right."""
    cfg = load_system("dgx-h100", gpus=4)
    for kernel in ("deepep", "deepep-ll", "nccl"):
        run = partial(run_ep, cfg, kernel, "dispatch", 8, 256, 4, 16, dtype="fp8")
        spy.clear()
        run()
        timing = spy["store_chains"] + spy["copy_loop"]
        assert timing > 0
        spy.clear()
        assert run(functional=True).correct is True
        assert spy["store_chains"] + spy["copy_loop"] == timing, kernel
