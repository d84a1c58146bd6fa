"""Provenance (issue 21): every --json, --out row and sweep row says which version,
commit, date, command and system (with a content hash of its configuration) made it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from cais.cli import main
from cais.config import apply_overrides, load_system
from cais.provenance import collect, content_hash, git_commit, package_version
from cais.sweep.runner import run_sweep


def test_content_hash_follows_the_content_not_the_key_order() -> None:
    a = load_system("dgx-h100").model_dump()
    assert content_hash(a) == content_hash(dict(reversed(list(a.items()))))
    b = load_system("dgx-h100", gpus=4).model_dump()
    assert content_hash(a) != content_hash(b)
    assert re.fullmatch(r"[0-9a-f]{16}", content_hash(a))


def test_version_and_commit_are_known_in_this_checkout() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", package_version())
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", git_commit())


def test_json_carries_provenance_with_the_command_and_sets(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "64K", "--json",
            "--set", "link.bandwidth_GBps=50"]
    assert main(argv) == 0
    prov = json.loads(capsys.readouterr().out)["provenance"]
    assert prov["command"] == "cais " + " ".join(argv)
    assert prov["sets"] == {"link.bandwidth_GBps": 50}
    assert prov["system"] == "dgx-h100"
    # the hash is of the overridden config
    want = apply_overrides(load_system("dgx-h100"), {"link.bandwidth_GBps": "50"})
    assert prov["system_sha256"] == content_hash(want.model_dump())
    assert prov["system_sha256"] != content_hash(load_system("dgx-h100").model_dump())
    assert prov["version"] == package_version() and prov["commit"] == git_commit()


def test_gemm_json_carries_provenance(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gemm", "--m", "256", "--n", "256", "--k", "256", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["provenance"]["command"].startswith("cais gemm")


def test_out_row_carries_provenance_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.csv"
    assert main(["collective", "--op", "allreduce", "--algo", "ring", "--bytes", "64K", "--out", str(out)]) == 0
    row = pd.read_csv(out).iloc[0]
    assert row["provenance.command"].startswith("cais collective")
    assert row["provenance.system_sha256"] == content_hash(load_system("dgx-h100").model_dump())
    assert row["provenance.version"] == package_version()


def test_sweep_rows_carry_provenance(tmp_path: Path) -> None:
    points = [{"kind": "collective", "system": "dgx-h100", "op": "allreduce", "algo": "nvls", "bytes": 65536}]
    t = run_sweep(points, tmp_path / "s.parquet", workers=1, progress=False, command="cais sweep s.yaml")
    row = t.iloc[0]
    assert row["status"] == "ok", row["error"]
    assert row["provenance.command"] == "cais sweep s.yaml" and row["provenance.commit"] == git_commit()
    assert row["provenance.system_sha256"] == content_hash(load_system("dgx-h100").model_dump())


def test_report_lines_name_every_set() -> None:
    p = collect("cais reproduce fig2", "dgx-h100", {"a": 1}, {"link.bandwidth_GBps": "50"})
    labels = dict(p.lines())
    assert labels["--set"] == "link.bandwidth_GBps=50" and labels["command"] == "cais reproduce fig2"
    assert set(p.columns()) == {f"provenance.{k}" for k in p.as_json()}


def test_a_python_api_result_carries_its_provenance() -> None:
    """``CollectiveRunSpec(...).run().as_json()`` (and a LayerSpec's) says what made it:
    version, commit, the spec as the command, the system and the hash of its config
    after the overrides (the same hash as a sweep row of the same run), the overrides."""
    from cais.experiments.spec import CollectiveRunSpec, SystemSpec
    from cais.sweep.point import run_point

    spec = CollectiveRunSpec("allreduce", "nvls", "64KiB", SystemSpec(gpus=4, sets=(("link.bandwidth_GBps", "50"),)))
    result = spec.run()
    prov = result.as_json()["provenance"]
    assert prov["version"] == package_version() and prov["commit"] == git_commit() and prov["system"] == "dgx-h100"
    assert prov["command"] == ("python: CollectiveRunSpec(op='allreduce', algo='nvls', nbytes='64KiB', "
                               "system=SystemSpec(gpus=4, sets=(('link.bandwidth_GBps', '50'),))).run()")
    assert json.loads(prov["sets"]) == {"link.bandwidth_GBps": 50}
    want = apply_overrides(load_system("dgx-h100", gpus=4), {"link.bandwidth_GBps": "50"})
    assert prov["system_sha256"] == content_hash(want.model_dump())
    row = run_point({"op": "allreduce", "algo": "nvls", "bytes": "64K", "gpus": 4, "set.link.bandwidth_GBps": 50})
    assert row["provenance.system_sha256"] == prov["system_sha256"] and row["busbw_GBps"] == result.busbw_GBps
    assert set(prov) == {k.removeprefix("provenance.") for k in result.provenance.columns()}
