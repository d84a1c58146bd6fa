"""`--set KEY=VALUE` on `cais collective` / `cais run`, and apply_overrides under it."""

import json
import subprocess
import sys

import pytest

from cais.cli import main
from cais.config import ConfigError, apply_overrides, config_values, load_system


def _cais(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cais.cli", *args], capture_output=True, text=True)


def _allreduce(capsys, *sets: str) -> dict:
    args = ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "1M", "--json"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_doubled_link_bandwidth_makes_a_collective_faster(capsys) -> None:
    # zero-copy NVLS: at 1 MiB the staged form's time is mostly its copies and syncs
    base = _allreduce(capsys, "collective.nvls_buffers=registered")
    fast = _allreduce(capsys, "collective.nvls_buffers=registered", "link.bandwidth_GBps=50")
    assert fast["overrides"] == {**base["overrides"], "link.bandwidth_GBps": 50}
    assert fast["time_us"] < 0.95 * base["time_us"]
    assert fast["busbw_GBps"] > base["busbw_GBps"]


def test_repeated_sets_all_apply_and_a_nested_list_works(capsys) -> None:
    out = _allreduce(capsys, "switch.chips=2", "switch.links_per_gpu=[9,9]", "gpus=4", "switch.model=nvls")
    assert out["overrides"] == {"switch.chips": 2, "switch.links_per_gpu": [9, 9], "gpus": 4,
                                "switch.model": "nvls"}
    assert out["gpus"] == 4
    assert {p.split("sw")[1].split("-")[0] for p in out["buffer_peak_kB"]} == {"0", "1"}  # two chips


def test_set_wins_over_gpus_flag_and_the_last_repeat_wins(capsys) -> None:
    assert main(["run", "--model", "paper-mega-gpt-4b", "--scheme", "tp-nvls", "--mode", "decode", "--sms", "66",
                 "--gpus", "4", "--set", "gpus=8", "--set", "gpus=2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == 2 and out["overrides"] == {"gpus": 2}


def test_out_row_records_the_overrides(tmp_path, capsys) -> None:
    import pandas as pd

    path = tmp_path / "runs.csv"
    assert main(["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "64K", "--out", str(path),
                 "--set", "link.latency_ns=100"]) == 0
    capsys.readouterr()
    row = pd.read_csv(path).iloc[0]
    assert row["link.latency_ns"] == 100 and json.loads(row["overrides"]) == {"link.latency_ns": 100}


@pytest.mark.parametrize("value,names", [
    ("link.bandwith_GBps=50", ["'link.bandwith_GBps'", "bandwidth_GBps", "latency_ns"]),
    ("nosuch=1", ["'nosuch'", "transfer_unit_bytes"]),
    ("gpus.count=1", ["'gpus.count'"]),
    ("link.bandwidth_GBps=-1", ["'link.bandwidth_GBps'", "greater than 0"]),
    ("link.bandwidth_GBps=abc", ["'link.bandwidth_GBps'", "valid number"]),
    ("link.buffer_scope=chip", ["'link.buffer_scope'", "'link' or 'port'"]),
    ("switch.links_per_gpu=[5,4,4]", ["switch.links_per_gpu", "chips is 4"]),
    ("link.bandwidth_GBps", ["--set", "KEY=VALUE"]),
    ("=5", ["--set", "KEY=VALUE"]),
])
def test_bad_set_is_one_line_naming_the_key_and_exit_2(value, names) -> None:
    proc = _cais("collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "64K", "--set", value)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--set" in lines[0]
    assert all(n in lines[0] for n in names), lines[0]


def test_run_rejects_a_bad_set_with_one_line() -> None:
    proc = _cais("run", "--model", "paper-mega-gpt-4b", "--scheme", "tp-nvls", "--mode", "decode",
                 "--set", "gpu.sms=0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'gpu.sms'" in lines[0]


def test_apply_overrides_is_generic_over_nested_fields() -> None:
    cfg = load_system("dgx-h100")
    new = apply_overrides(cfg, {"gpu.name": "5", "link.credit_latency_ns": "null", "collective.ring_slots": "4",
                                "packet.write_ack_flits": "1", "link.vc_policy": "one"})
    assert new.gpu.name == "5" and new.link.credit_latency_ns is None and new.collective.ring_slots == 4
    assert new.packet.write_ack_flits == 1 and new.link.vc_policy == "one"
    assert new.link.bandwidth_GBps == cfg.link.bandwidth_GBps and cfg.collective.ring_slots == 8
    assert apply_overrides(cfg, {}) is cfg
    assert config_values(new, ["gpu.name", "link.vc_policy"]) == {"gpu.name": "5", "link.vc_policy": "one"}


def test_apply_overrides_checks_the_whole_system() -> None:
    cfg = load_system("dgx-h100")
    with pytest.raises(ConfigError, match="transfer_unit_bytes must be a multiple"):
        apply_overrides(cfg, {"transfer_unit_bytes": "1000"})
    assert apply_overrides(cfg, {"transfer_unit_bytes": "65536"}).transfer_unit_bytes == 65536


def test_a_section_set_as_an_object_merges_into_the_preset(capsys) -> None:
    """Issue 59: ``--set 'gpu={"sms":66}'`` replaced the whole gpu section, so every
    other gpu field fell back to the built-in default (remote_outstanding_kB 1280 -> null).
    It merges, on the command line and in the Python API alike."""
    from cais.experiments.spec import SystemSpec

    preset = load_system("dgx-h100")
    assert preset.gpu.remote_outstanding_kB == 1280  # a preset value that differs from the default (null)
    cfg = apply_overrides(preset, {"gpu": '{"sms": 66}'})
    assert cfg.gpu.sms == 66 and cfg.gpu.remote_outstanding_kB == preset.gpu.remote_outstanding_kB
    assert cfg.gpu.model_dump() == {**preset.gpu.model_dump(), "sms": 66}
    two_down = apply_overrides(preset, {"gpu": '{"interference": {"hbm": false}}', "switch.merge": '{"entries": 40}'})
    assert two_down.gpu.interference.model_dump() == {**preset.gpu.interference.model_dump(), "hbm": False}
    assert two_down.switch.merge.model_dump() == {**preset.switch.merge.model_dump(), "entries": 40}
    assert two_down.gpu.remote_outstanding_kB == 1280
    api, values = SystemSpec("dgx-h100", sets={"gpu": {"sms": 66}}).build()
    assert api == cfg and values["gpu"]["remote_outstanding_kB"] == 1280
    out = _allreduce(capsys, 'gpu={"sms":66}')
    assert out["overrides"]["gpu"] == cfg.gpu.model_dump(mode="json")
    with pytest.raises(ConfigError, match=r"'gpu\.smss': Extra inputs"):
        apply_overrides(preset, {"gpu": '{"smss": 66}'})
