"""The core's profile-guided build (docs/core.md, "A profile-guided build"): the profile
pip's build reads is there and is one LLVM can read, and the digest that tells a stale
profile from a current one follows the core's sources."""

import importlib.util
import shutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):  # noqa: ANN202 - a module loaded from a file
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


workload = _load("pgo_workload", ROOT / "scripts" / "pgo_workload.py")
bench = _load("bench_core_pgo", ROOT / "benchmarks" / "bench_core.py")


def test_the_build_reads_an_indexed_llvm_profile_that_is_there() -> None:
    args = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["maturin"]["rustc-args"]
    uses = [a.removeprefix("-Cprofile-use=") for a in args if a.startswith("-Cprofile-use=")]
    assert len(uses) == 1
    profile = ROOT / "rust" / uses[0]  # cargo runs rustc in rust/, the crate's workspace root
    assert profile.is_file()
    assert profile.read_bytes()[:8] == b"\xfflprofi\x81"  # LLVM's indexed profile magic


def _crate(tmp: Path) -> Path:
    rust = tmp / "rust"
    shutil.copytree(ROOT / "rust" / "src", rust / "src")
    for name in ("Cargo.toml", "Cargo.lock"):
        shutil.copy(ROOT / "rust" / name, rust / name)
    return rust


def test_digest_follows_the_sources(tmp_path: Path) -> None:
    rust = _crate(tmp_path)
    first = workload.source_digest(rust)
    assert workload.source_digest(rust) == first
    assert first == workload.source_digest(ROOT / "rust")  # where the crate lies does not matter
    some = sorted((rust / "src").rglob("*.rs"))
    assert len(some) > 10
    some[3].write_text(some[3].read_text() + "\n")
    assert workload.source_digest(rust) != first


def test_state_says_when_the_profile_is_stale(tmp_path: Path) -> None:
    rust = _crate(tmp_path)
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "pgo_workload.py", tmp_path / "scripts")
    (rust / "pgo").mkdir()
    assert bench.profile_state(tmp_path) == "no profile-guided build"
    (rust / "pgo" / "made-from.txt").write_text(workload.source_digest(rust) + "\n")
    assert bench.profile_state(tmp_path).endswith("made from these sources")
    (rust / "Cargo.toml").write_text((rust / "Cargo.toml").read_text() + "\n")
    assert "other sources" in bench.profile_state(tmp_path)
