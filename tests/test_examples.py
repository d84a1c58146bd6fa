"""examples/python_api.py runs as a user runs it and gives what docs/python.md says,
and every code block of docs/python.md is a part of it, word for word (so CI runs each
block)."""

from __future__ import annotations

import json
import re
import runpy
import sys
import tempfile
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pandas as pd
import pytest

from cais.experiments.spec import SystemSpec
from cais.provenance import content_hash, git_commit, package_version

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "python_api.py"
DOC = ROOT / "docs" / "python.md"


def _sections(text: str) -> dict[str, str]:
    """The example's parts: ``# --- name`` ... ``# ---``."""
    return {m[1]: m[2].rstrip("\n") for m in re.finditer(r"^# --- (.+?)\n(.*?)^# ---\n", text, re.S | re.M)}


def test_every_python_block_of_the_doc_is_a_part_of_the_example_and_back() -> None:
    blocks = [b.rstrip("\n") for b in re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)]
    parts = _sections(EXAMPLE.read_text())
    assert len(parts) >= 7 and len(blocks) == len(parts)
    for block in blocks:
        assert block in parts.values(), f"docs/python.md block not in examples/python_api.py:\n{block[:300]}"
    for name, part in parts.items():
        assert part in blocks, f"examples/python_api.py part '{name}' is not in docs/python.md"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    """The example run once, as ``python examples/python_api.py``: its names, what it
    printed and its folder (its new temporary folder, made under the test's)."""
    tmp = tmp_path_factory.mktemp("example")
    argv, sys.argv = sys.argv, [str(EXAMPLE)]
    tempdir, tempfile.tempdir = tempfile.tempdir, str(tmp)
    try:
        printed = StringIO()
        with redirect_stdout(printed):
            names = runpy.run_path(str(EXAMPLE), run_name="__main__")
    finally:
        sys.argv, tempfile.tempdir = argv, tempdir
    out = names["out_dir"]
    assert out.parent == tmp and f"files in {out}" in printed.getvalue()
    return names, printed.getvalue(), out


def test_one_layer_and_its_provenance(example) -> None:
    names, printed, _ = example
    r, result = names["r"], names["result"]
    assert r.total_us > 0 and set(r.sublayers) >= {"L1", "L2"} and result["total_us"] == r.total_us
    prov = result["provenance"]
    cfg, _ = SystemSpec("dgx-h100", gpus=4).build()
    assert prov["system_sha256"] == content_hash(cfg.model_dump()) and prov["system"] == "dgx-h100"
    assert prov["version"] == package_version() and prov["commit"] == git_commit()
    assert prov["command"] == ("python: LayerSpec(model='paper-mega-gpt-4b', scheme='cais', mode='prefill', "
                               "system=SystemSpec(gpus=4), batch=1, seq=64).run()")
    assert f"{r.total_us:,.1f} us per layer period" in printed


def test_a_collective_takes_sizes_with_units_and_refuses_an_ambiguous_one(example) -> None:
    names, printed, _ = example
    ar, spec = names["ar"], names["allreduce"]
    assert spec.nbytes == "16MiB" and ar.nbytes == 16 << 20 and ar.busbw_GBps > 0
    assert "'1.5K' is 1536 bytes" in printed and "'16M' is 16777216 bytes" in printed
    refusal = [line for line in printed.splitlines() if "16MB" in line]
    assert len(refusal) == 1 and refusal[0].startswith("nbytes: ")  # one line, naming the field


def test_overrides_change_the_system_and_the_result_says_which(example) -> None:
    names, _, out = example
    cfg, overrides, ar, slow = names["cfg"], names["overrides"], names["ar"], names["ar_slow"]
    assert (cfg.link.bandwidth_GBps, cfg.link.latency_ns) == (12.5, 500)
    assert overrides == {"link.bandwidth_GBps": 12.5, "link.latency_ns": 500}
    assert slow.time_us > ar.time_us  # a quarter of the bandwidth, twice the latency
    assert json.loads(slow.as_json()["provenance"]["sets"]) == overrides
    assert slow.provenance.system_sha256 != ar.provenance.system_sha256
    mine = names["mine"]  # the system file: 50 GB/s links, faster than the preset's
    assert mine.time_us < ar.time_us and mine.provenance.system == str(out / "my-h100.json")


def test_a_model_from_a_hugging_face_config(example) -> None:
    names, _, _ = example
    model, tiny = names["model"], names["tiny"]
    assert (model.name, model.hidden, model.ffn_hidden, model.heads, model.kv_heads) == ("TinyLlama-1.1B", 2048,
                                                                                        5632, 32, 4)
    assert model.norm == "rmsnorm" and model.activation == "swiglu" and model.seq == 64
    assert tiny.model == "TinyLlama-1.1B" and tiny.total_us > 0


def test_a_sweep_into_a_dataframe_and_a_resumed_one(example) -> None:
    names, _, out = example
    df, table, again = names["df"], names["table"], names["again"]
    assert len(df) == 4 and set(df["scheme"]) == {"tp-nvls", "cais"}
    assert {"provenance.version", "provenance.commit", "provenance.system_sha256"} <= set(df.columns)
    assert df.groupby("link.bandwidth_GBps")["provenance.system_sha256"].nunique().eq(1).all()
    assert df["provenance.system_sha256"].nunique() == 2  # one config per bandwidth
    assert table.attrs == {"points_run": 4, "points_reused": 0}
    assert again.attrs == {"points_run": 0, "points_reused": 4}  # nothing simulated the second time
    assert list(table["status"]) == ["ok"] * 4 and table["provenance.command"].str.startswith("python: ").all()
    same = pd.merge(df, table, on=["scheme", "link.bandwidth_GBps"], suffixes=("", ".sweep"))
    assert len(same) == 4 and (same["total_us"] == same["total_us.sweep"]).all()  # the same runs, the same numbers
    assert pd.read_parquet(out / "sweep.parquet")["point_id"].is_unique
