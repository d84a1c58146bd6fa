"""The runs the compiled core's profile-guided build learns from (scripts/pgo.sh).

Profile-guided optimisation lays out and inlines the core's code for the paths a
training run takes, so the run must take the paths users take: every scheme's
prefill period (the grid's bulk), CAIS's training period in both L2 worlds, a
decode period, and the collectives the validation tables time (staged and
registered NVLS, the ring) on ``dgx-h100`` and 16 GPUs of ``nvl72``. The profile only moves
code; it never changes a result (docs/core.md, "A profile-guided build").

    python scripts/pgo_workload.py            (scripts/pgo.sh runs it on the instrumented core)
    python scripts/pgo_workload.py --digest   (a digest of the core's sources)
    python scripts/pgo_workload.py --state    (whether the profile was made from them)

A profile made from other sources still builds: rustc drops the functions whose code
changed (a warning each) and lays them out without it. ``scripts/pgo.sh`` writes the
digest of ``rust/``'s sources beside the profile (``rust/pgo/made-from.txt``);
``--state`` compares the two, and ``.ci/run`` and ``benchmarks/bench_core.py`` print it.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

from cais.experiments.collective import run_collective
from cais.experiments.layer import run_layer
from cais.config import apply_overrides, load_system
from cais.schemes import schemes
from cais.workload.models import load_model

SMS = 66  # the reproduction's SMs per GPU
RUST = Path(__file__).resolve().parent.parent / "rust"


def source_digest(rust: Path = RUST) -> str:
    """SHA-256 over the crate's manifest, lock file and every ``.rs`` under ``src/``,
    each as its path relative to ``rust`` and its bytes, in path order."""
    h = hashlib.sha256()
    files = [rust / "Cargo.toml", rust / "Cargo.lock", *sorted((rust / "src").rglob("*.rs"))]
    for path in files:
        h.update(path.relative_to(rust).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def profile_state(rust: Path = RUST) -> str:
    """Whether the crate's profile (``rust/pgo``) was made from its sources as they are."""
    made = rust / "pgo" / "made-from.txt"
    if not made.is_file():
        return "no profile-guided build"
    if made.read_text().strip() == source_digest(rust):
        return "profile-guided, the profile made from these sources"
    return "profile-guided, but the profile was made from other sources (scripts/pgo.sh remakes it)"


def workload() -> None:
    model = load_model("paper-llama-7b")
    sold = load_system("dgx-h100")
    kept = apply_overrides(sold, {"gpu.l2_keeps_peer_reads": "true"})
    start = time.perf_counter()

    def done(what: str) -> None:
        print(f"{time.perf_counter() - start:7.1f} s  {what}", flush=True)

    for scheme in schemes():
        run_layer(sold, model, scheme, "prefill", SMS)
        done(f"{scheme} prefill")
    run_layer(kept, model, "cais", "prefill", SMS)
    done("cais prefill, L2 kept")
    for name, cfg in (("as sold", sold), ("L2 kept", kept)):
        run_layer(cfg, model, "cais", "train", SMS)
        done(f"cais train, {name}")
    run_layer(sold, model, "tp-nvls", "decode", SMS)
    done("tp-nvls decode")
    for buffers, nbytes in (("staged", 64 << 20), ("registered", 256 << 20)):
        run_collective(apply_overrides(sold, {"collective.nvls_buffers": buffers}), "allreduce", "nvls", nbytes)
        done(f"NVLS AllReduce {nbytes >> 20} MiB, {buffers}")
    run_collective(sold, "allreduce", "ring", 64 << 20)
    done("ring AllReduce 64 MiB")
    run_collective(apply_overrides(load_system("nvl72"), {"gpus": "16"}), "allreduce", "nvls", 1 << 20)
    done("NVLS AllReduce 1 MiB on 16 GPUs of nvl72")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--digest", action="store_true", help="print the digest of rust/'s sources and exit")
    what.add_argument("--state", action="store_true", help="say whether rust/pgo's profile was made from them")
    args = ap.parse_args(argv)
    if args.digest:
        print(source_digest())
    elif args.state:
        print(profile_state())
    else:
        try:
            workload()
        except KeyboardInterrupt:
            print("pgo_workload: interrupted", file=sys.stderr)
            return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
