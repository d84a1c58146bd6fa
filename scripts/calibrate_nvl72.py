"""The two calibrations of the ``nvl72`` preset, regenerated (issue 22).

nccl-tests runs NCCL's staged NVLS AllReduce (its buffers are not registered), with
32 NVLS channels on sm100 (NVIDIA/nccl v2.26.6-1, ``src/transport/nvls.cc``). Two
rates of that kernel are not known for Blackwell and are fitted here, each on one
part of the published curves (``data/published/nccl_tests.csv``), the rest being the
check (``scripts/validate_presets.py``):

1. ``collective.nvls_copy_GBps``, one channel's staging-copy rate on sm100, on the
   two-tray 8-GPU points of 2, 4 and 8 GiB (where the copies set the time; the switch
   chips' reduction rate does not bind at 8 GPUs);
2. ``switch.reduce_GBps``, the switch chip's NVLS reduction rate, with that copy rate,
   on the 72-GPU point of 8 GiB.

Each table prints the error per fit point and their mean |error| for every candidate;
the preset keeps the candidate with the smallest mean.

    .venv/bin/python scripts/calibrate_nvl72.py [--copy 14 14.5 15 15.5 16] [--reduce 1900 2000 2100 2200 2300]
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from multiprocessing import Pool
from multiprocessing.pool import Pool as PoolType

from cais.errors import UserError
from cais.experiments.collective import run_collective
from cais.experiments.published import published
from cais.config import apply_overrides, load_system

STAGED = {"collective.nvls_buffers": "staged", "collective.nvls_channels": "32"}


def _time_us(gpus: int, nbytes: int, sets: dict[str, str]) -> float:
    cfg = apply_overrides(load_system("nvl72", gpus=gpus), {**STAGED, **sets})
    return run_collective(cfg, "allreduce", "auto", nbytes, protocol="auto", sim="mirror").time_us


def _table(title: str, key: str, values: list[str], gpus: int, sizes: list[int], fixed: dict[str, str],
           pool: PoolType) -> str:
    """Print one fit table; return the value with the smallest mean |error|."""
    t = published()
    theirs = {int(b): float(us) for b, us in t[(t["system"] == "nvl72") & (t["gpus"] == gpus)
                                              & t["bytes"].isin(sizes)][["bytes", "time_us"]].itertuples(index=False)}
    assert sorted(theirs) == sorted(sizes), f"published points missing: {sorted(set(sizes) - set(theirs))}"
    jobs = {(v, s): pool.apply_async(_time_us, (gpus, s, {**fixed, key: v})) for v in values for s in sizes}
    print(f"\n{title}\n")
    print(f"| {key} | " + " | ".join(f"{s >> 30} GiB" for s in sizes) + " | mean \\|error\\| |")
    print("|---|" + "---|" * (len(sizes) + 1))
    best, best_mean = values[0], float("inf")
    for v in values:
        errs = [jobs[v, s].get() / theirs[s] - 1 for s in sizes]
        mean = sum(abs(e) for e in errs) / len(errs)
        print(f"| {v} | " + " | ".join(f"{100 * e:+.1f} %" for e in errs) + f" | {100 * mean:.1f} % |", flush=True)
        if mean < best_mean:
            best, best_mean = v, mean
    print(f"\nsmallest mean |error|: {key} = {best}")
    return best


def _positive(kind: type) -> object:
    """An argparse type: a number of ``kind`` above 0, kept as the text given."""
    def parse(text: str) -> str:
        try:
            ok = math.isfinite(kind(text)) and kind(text) > 0
        except ValueError:
            ok = False
        if not ok:
            raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text!r}")
        return text
    return parse


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--copy", nargs="+", type=_positive(float), default=["14.0", "14.5", "15.0", "15.5", "16.0"],
                    help="candidate copy rates (GB/s per channel)")
    ap.add_argument("--reduce", nargs="+", type=_positive(float), default=["1900", "2000", "2100", "2200", "2300"],
                    help="candidate reduction rates (GB/s of operands per chip)")
    ap.add_argument("--workers", type=_positive(int), default="2", help="processes (at least 1)")
    args = ap.parse_args()
    # the workers leave Ctrl-C to this process, which stops them
    pool = Pool(int(args.workers), initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN))
    try:
        copy = _table("1. Staging-copy rate on the two-tray 8-GPU curve (fit points: 2, 4, 8 GiB)",
                      "collective.nvls_copy_GBps", args.copy, 8, [2 << 30, 4 << 30, 8 << 30], {}, pool)
        _table(f"2. Reduction rate on the 72-GPU rack (fit point: 8 GiB; copy rate {copy} GB/s)",
               "switch.reduce_GBps", args.reduce, 72, [8 << 30], {"collective.nvls_copy_GBps": copy}, pool)
    except UserError as exc:
        print(f"calibrate_nvl72: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("calibrate_nvl72: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        pool.terminate()


if __name__ == "__main__":
    main()
