"""The `cais` command: JSON contract, one-line errors with exit code 2, presets."""

import json
import subprocess
import sys

import pytest

from cais.cli import main
from cais.errors import UserError
from cais.config import ConfigError, list_systems, load_system


def _cais(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cais.cli", *args], capture_output=True, text=True)


def test_collective_json_has_the_contract_keys(capsys) -> None:
    assert main(["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "1M", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"time_us", "algbw_GBps", "busbw_GBps"} <= out.keys()
    assert out["busbw_GBps"] == pytest.approx(out["algbw_GBps"] * 2 * 7 / 8)


def test_gemm_json_has_the_contract_keys(capsys) -> None:
    assert main(["gemm", "--m", "4096", "--n", "4096", "--k", "4096", "--sms", "66", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["time_us"] > 0 and 50 < out["tflops"] < 989


@pytest.mark.parametrize("args,names", [
    (["collective", "--op", "alltoall", "--algo", "nvls", "--bytes", "1M"], "--op"),
    (["collective", "--op", "allreduce", "--algo", "tree", "--bytes", "1M"], "--algo"),
    (["collective", "--op", "allreduce", "--algo", "ring", "--bytes", "lots"], "--bytes"),
    (["collective", "--op", "allreduce", "--algo", "ring", "--bytes", "3"], "--bytes"),
    (["collective", "--op", "allreduce", "--algo", "ring", "--bytes", "1M", "--system", "dgx-a100"], "--system"),
    (["gemm", "--m", "0", "--n", "1", "--k", "1"], "--m"),
    (["gemm", "--m", "8", "--n", "8", "--k", "8", "--sms", "1000"], "--sms"),
])
def test_bad_arguments_give_one_line_and_exit_2(args, names) -> None:
    proc = _cais(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in proc.stderr


def test_presets_load_and_nvl72_is_expressible() -> None:
    assert {"dgx-h100", "dgx-h200", "dgx-h100-paper", "nvl72"} <= list_systems().keys()
    nvl = load_system("nvl72")
    assert nvl.gpus == 72 and nvl.switch.chips == 18 and nvl.links_per_gpu == 18
    assert load_system("dgx-h100").links_per_gpu == 18


def test_a_bad_system_file_names_the_field(tmp_path) -> None:
    bad = tmp_path / "mine.json"
    bad.write_text(json.dumps({"base": "dgx-h100", "name": "mine", "switch": {"chips": 4, "links_per_gpu": [5, 4, 4]}}))
    with pytest.raises(ConfigError, match="switch"):
        load_system(str(bad))


def test_nvl72_collective_runs_functionally() -> None:
    from cais.experiments.collective import run_collective

    cfg = load_system("nvl72")
    # all 72 GPUs on the zero-copy kernel; NCCL's staged one (the preset's) on 8 of them:
    # at 72 GPUs its every step fences 72 x 18 chips (a minute for this tiny buffer)
    zero_copy = cfg.with_overrides(collective={**cfg.collective.model_dump(), "nvls_buffers": "registered"})
    r = run_collective(zero_copy, "allreduce", "nvls", 72 * 130 * 2, functional=True)
    assert r.correct and r.conservation.ok and r.nvls_buffers == "registered"
    staged = run_collective(load_system("nvl72", gpus=8), "allreduce", "nvls", 8 * 130 * 2, functional=True)
    assert staged.correct and staged.conservation.ok and staged.nvls_buffers == "staged"


def test_run_json_has_the_contract_keys(capsys) -> None:
    assert main(["run", "--model", "paper-mega-gpt-4b", "--scheme", "sp-nvls", "--mode", "prefill", "--sms", "66",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"total_us", "sublayers", "link_util", "wire_bytes", "buffer_peak_kB"} <= out.keys()
    lu = out["link_util"]
    assert set(lu) == {"mean", "max", "per_gpu"} and set(lu["per_gpu"]) == {str(g) for g in range(8)}
    assert 0 < lu["mean"] <= lu["max"] <= 1
    assert all(set(d) == {"up", "down"} for d in out["wire_bytes"].values())
    assert set(out["sublayers"]) == {"L1", "L2"}
    for sub in out["sublayers"].values():
        assert 0 < sub["bound_us"] <= sub["time_us"]
    assert out["total_us"] > sum(s["time_us"] for s in out["sublayers"].values())


@pytest.mark.parametrize("args,names", [
    (["run", "--model", "gpt5", "--scheme", "tp-nvls", "--mode", "train"], "--model"),
    (["run", "--model", "llama3-8b", "--scheme", "nccl", "--mode", "train"], "--scheme"),
    (["run", "--model", "llama3-8b", "--scheme", "tp-nvls", "--mode", "serve"], "--mode"),
])
def test_run_bad_arguments_give_one_line(args, names) -> None:
    proc = _cais(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in proc.stderr


def test_collective_json_has_link_util_wire_bytes_and_buffer_peaks(capsys) -> None:
    assert main(["collective", "--op", "allreduce", "--algo", "ring", "--bytes", "1M", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    lu = out["link_util"]
    assert out["wire_util"] == lu["max"] and 0 < lu["mean"] <= lu["max"] <= 1
    assert set(lu["per_gpu"]) == set(out["wire_bytes"]) == {str(g) for g in range(8)}
    span_ps = out["time_us"] * 1e6 - 3e6  # from launch (3 us) to the end
    for g, d in out["wire_bytes"].items():
        for direction in ("up", "down"):
            assert lu["per_gpu"][g][direction] == pytest.approx(d[direction] / (450e-3 * span_ps), rel=1e-6)
    peaks = out["buffer_peak_kB"]  # every port direction has credit-controlled input buffers
    assert len(peaks) == 2 * 8 * 4
    cap_kB = {c: 1024 * 16 * n / 1000 for c, n in enumerate([5, 4, 4, 5])}  # one VC: depth x flit x links
    for port, peak in peaks.items():
        chip = int(port.split("sw")[1].split("-")[0])
        assert 0 < peak <= cap_kB[chip]
    assert out["bytes"] == 1 << 20


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_out_appends_one_row_per_run(tmp_path, suffix, capsys) -> None:
    import pandas as pd

    path = tmp_path / f"runs{suffix}"
    for algo in ("nvls", "ring"):
        assert main(["collective", "--op", "allreduce", "--algo", algo, "--bytes", "64K", "--out", str(path)]) == 0
    assert main(["run", "--model", "paper-mega-gpt-4b", "--scheme", "tp-nvls", "--mode", "decode", "--sms", "66",
                 "--gpus", "4", "--out", str(path)]) == 0
    capsys.readouterr()
    df = pd.read_parquet(path) if suffix == ".parquet" else pd.read_csv(path)
    assert len(df) == 3
    assert {"link.bandwidth_GBps", "switch.chips", "gpu.sms", "command", "op", "algo", "bytes", "time_us",
            "link_util.mean", "link_util.max", "link_util.per_gpu.0.up", "wire_bytes.7.down",
            "model", "scheme", "mode", "total_us", "sublayers.L1.time_us"} <= set(df.columns)
    assert df["algo"].tolist()[:2] == ["nvls", "ring"] and df["command"].tolist() == ["collective"] * 2 + ["run"]
    assert df["gpus"].tolist() == [8, 8, 4] and df["link.bandwidth_GBps"].tolist() == [25.0] * 3
    assert (df["link_util.mean"] > 0).all()


def test_bad_out_suffix_is_one_line_and_writes_nothing(tmp_path) -> None:
    path = tmp_path / "runs.xlsx"
    proc = _cais("collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "64K", "--out", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--out" in lines[0] and ".parquet" in lines[0] and ".csv" in lines[0]
    assert not path.exists()


def test_a_bad_existing_table_is_left_as_it_was(tmp_path, capsys) -> None:
    path = tmp_path / "runs.parquet"
    path.write_bytes(b"not parquet")
    assert main(["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "64K", "--out", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0]
    assert path.read_bytes() == b"not parquet"


def test_trace_option_writes_a_trace(tmp_path, capsys) -> None:
    path = tmp_path / "t.json"
    assert main(["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "64K", "--trace", str(path),
                 "--trace-tb-limit", "10", "--trace-bin-us", "0.5", "--json"]) == 0
    json.loads(capsys.readouterr().out)  # stdout stays one JSON object
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ns" and trace["otherData"]["bin_us"] == 0.5
    assert sum(e["args"]["tbs"] for e in trace["traceEvents"] if e.get("cat") == "tb") == 8 * 16


def test_run_trace_of_cais_base_has_merge_table_tracks(tmp_path, capsys) -> None:
    path = tmp_path / "cais.json"
    assert main(["run", "--model", "paper-mega-gpt-4b", "--scheme", "cais-base", "--mode", "prefill", "--gpus", "4",
                 "--batch", "1", "--seq", "256", "--sms", "8", "--trace", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    tracks: dict[str, float] = {}
    for e in json.loads(path.read_text())["traceEvents"]:
        if e["ph"] == "C" and e["name"].endswith(" merge table"):
            tracks[e["name"]] = max(tracks.get(e["name"], 0.0), e["args"]["kB"])
    peaks = out["merge_table_peak_kB"]["per_port"]
    assert tracks and max(tracks.values()) > 0
    assert tracks == pytest.approx({f"{port} merge table": kB for port, kB in peaks.items() if kB > 0})


def test_a_deadlocking_system_stops_with_one_line_and_exit_code_3(tmp_path) -> None:
    """Requests and responses on one VC, 64 B buffers, one read served at a time: the
    NVLS pulls deadlock and the watchdog names what is stuck."""
    from cais.config import load_system
    data = load_system("dgx-h100").model_dump()
    data["name"] = "deadlock"
    data["link"].update(vc_policy="shared", vc_depth_flits=4, buffer_scope="port")
    data["gpu"]["read_serve_kB"] = 0.5
    path = tmp_path / "deadlock.json"
    path.write_text(json.dumps(data))
    proc = _cais("collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "1M", "--system", str(path))
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("cais: stalled: deadlock") and "waiting for credits" in lines[0]
    assert "TB(s) waiting in nvls-allreduce" in lines[0]


def test_ctrl_c_is_one_line_and_exit_code_130(monkeypatch, capsys) -> None:
    import cais.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "cmd_systems", interrupted)
    assert main(["systems"]) == 130
    assert capsys.readouterr().err == "cais: interrupted\n"


def test_a_stopped_command_line_freezes_what_it_leaves_and_a_callers_process_is_untouched() -> None:
    # the command line's own process (argv None): what an interrupted run left is kept out
    # of the collection at exit; main() given argv (a caller's process) freezes nothing
    code = ("import gc, sys\n"
            "import cais.cli as cli\n"
            "def stop(args):\n"
            "    raise KeyboardInterrupt\n"
            "cli.cmd_systems = stop\n"
            "assert cli.main(['systems']) == 130 and gc.get_freeze_count() == 0\n"
            "sys.argv = ['cais', 'systems']\n"
            "print(cli.main(), gc.get_freeze_count() > 0)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["130", "True"]
    assert proc.stderr == "cais: interrupted\ncais: interrupted\n"


def test_every_option_of_every_command_has_help_text() -> None:
    import argparse

    from cais.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    checked = 0
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                checked += 1
                assert action.help, f"cais {name} {action.option_strings[0]} has no help"
    assert checked >= 25


def test_as_flags_shows_parameter_names_as_the_commands_flags() -> None:
    from cais.cli import as_flags

    run = {"--model", "--scheme", "--mode", "--sms", "--sim", "--batch", "--seq", "--trace-bin-us"}
    assert as_flags("sms: must be between 1 and 132 on dgx-h100, got 0", run) == \
        "--sms: must be between 1 and 132 on dgx-h100, got 0"
    assert as_flags("sim mirror: this run is not symmetric: x; use sim='full'", run) == \
        "--sim mirror: this run is not symmetric: x; use --sim full"
    assert as_flags("trace_bin_us: too fine", run) == "--trace-bin-us: too fine"  # underscores as dashes
    # only names that are options of this command; bare words stay as they are
    assert as_flags("bytes 1,024: too big; use bytes of at most about 1M", run) == \
        "bytes 1,024: too big; use bytes of at most about 1M"
    assert as_flags("x: use a smaller batch or seq", run) == "x: use a smaller batch or seq"
    assert as_flags("point 2 of 2 (scheme=nope): scheme: unknown scheme 'nope'; use sim='full'", set()) == \
        "point 2 of 2 (scheme=nope): scheme: unknown scheme 'nope'; use sim='full'"
    # flag-worded messages, dotted keys and quoted names that are not name='value' are left alone
    assert as_flags("--set gpus=16: system 'dgx-h100' has 8 GPUs", {"--set", "--gpus"}) == \
        "--set gpus=16: system 'dgx-h100' has 8 GPUs"
    assert as_flags("set.sim='full' and model 'sim'", run) == "set.sim='full' and model 'sim'"
    assert as_flags("model: unknown model 'gpt5'", {"--models"}) == "model: unknown model 'gpt5'"


def test_library_messages_name_parameters_and_the_command_shows_flags(capsys) -> None:
    from cais.experiments.gemm import run_gemm

    with pytest.raises(UserError, match=r"^sms: must be between 1 and 132 on dgx-h100, got 1000$"):
        run_gemm(load_system("dgx-h100"), 8, 8, 8, 1000)
    assert main(["gemm", "--m", "8", "--n", "8", "--k", "8", "--sms", "1000"]) == 2
    assert capsys.readouterr().err == "cais: error: --sms: must be between 1 and 132 on dgx-h100, got 1000\n"


COLL_1M = ["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "1M"]


def _refusal(capsys, args: list[str]) -> str:
    """The one stderr line of a refused command (exit 2, nothing on stdout); argparse's
    refusals end in SystemExit(2) in-process."""
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("cais: error: ") and "Traceback" not in err
    return err.strip()


@pytest.mark.parametrize("args, says", [
    (["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "-1M"],
     "argument --bytes: expected a positive size, got '-1M'"),
    (["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "-1e6"],
     "argument --bytes: expected a positive size, got '-1e6'"),
    ([*COLL_1M, "--unit", "-4K"], "argument --unit: expected a positive size, got '-4K'"),
    ([*COLL_1M, "--trace", "t.json", "--trace-bin-us", "-1e-3"],
     "argument --trace-bin-us: expected a positive number, got -1e-3"),
    (["run", "--model", "paper-llama-7b", "--scheme", "tp-nvls", "--mode", "decode", "--batch", "-1k"],
     "argument --batch: expected a positive integer, got '-1k'"),
    (["demo", "--bytes", "-inf"], "argument --bytes: '-inf' is not a finite size"),
])
def test_a_negative_number_is_a_value_refused_by_its_flag(capsys, args, says) -> None:
    """Issue 59: argparse took ``-1M`` for an option (``--bytes: expected one argument``);
    a negative number is the flag's value, refused naming the flag and what it allows."""
    err = _refusal(capsys, args)
    assert says in err and "expected one argument" not in err


def test_an_option_is_still_an_option_after_the_negative_number_change(capsys) -> None:
    assert "unrecognized arguments: -x" in _refusal(capsys, [*COLL_1M, "-x"])
    assert "expected one argument" in _refusal(capsys, ["collective", "--op", "allreduce", "--algo", "nvls",
                                                        "--bytes", "--json"])


@pytest.mark.parametrize("args, says", [
    ([*COLL_1M, "--set", "link.bandwidth_GBps=nan"],
     "--set: invalid value 'nan' for 'link.bandwidth_GBps': not a number (NaN); Input should be greater than 0"),
    ([*COLL_1M, "--set", "link.latency_ns=NaN"],
     "for 'link.latency_ns': not a number (NaN); Input should be greater than or equal to 0"),
    ([*COLL_1M, "--set", 'gpu={"sms": NaN}'], "for 'gpu.sms': not a number (NaN)"),
    (["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "nan"],
     "argument --bytes: 'nan' is not a number (NaN); expected a positive size"),
    (["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "-nan"],
     "argument --bytes: '-nan' is not a number (NaN)"),
    ([*COLL_1M, "--trace", "t.json", "--trace-bin-us", "nan"],
     "argument --trace-bin-us: 'nan' is not a number (NaN); expected a positive number"),
])
def test_a_nan_is_refused_as_not_a_number_naming_the_field(capsys, args, says) -> None:
    """Issue 59: a NaN was refused as "should be greater than or equal to 0"; it is
    not a number, and the message says so, naming the field and what it allows."""
    assert says in _refusal(capsys, args)


def test_a_nan_in_the_python_api_is_not_a_number_too() -> None:
    from cais.experiments.spec import CollectiveRunSpec, SystemSpec
    from cais.workload.models import ModelError, load_model

    with pytest.raises(ConfigError, match=r"'link\.latency_ns': not a number \(NaN\); Input should be greater"):
        SystemSpec(sets={"link.latency_ns": float("nan")}).build()
    with pytest.raises(UserError, match=r"nbytes: 'nan' is not a number \(NaN\)"):
        CollectiveRunSpec("allreduce", "nvls", float("nan")).size()
    with pytest.raises(ModelError, match=r"field 'batch': not a number \(NaN\)"):
        load_model("paper-llama-7b", batch=float("nan"))


def test_gemm_launch_graph_checks_a_published_graph_mode_row(capsys) -> None:
    """cais gemm --launch graph: the graph's dependent-kernel gap instead of the fitted
    per-GEMM overhead (vLLM PR #23280's 16 x 2112 x 7168: 9.77 us published)."""
    import json as _json

    assert main(["gemm", "--m", "16", "--n", "2112", "--k", "7168", "--launch", "graph", "--json"]) == 0
    graph = _json.loads(capsys.readouterr().out)
    assert main(["gemm", "--m", "16", "--n", "2112", "--k", "7168", "--json"]) == 0
    fitted = _json.loads(capsys.readouterr().out)
    assert graph["launch"] == "graph" and fitted["launch"] == "fitted"
    assert graph["split"] == "stream-K" and graph["units"] == 132 and graph["tiles"] == 17
    assert 9.77 < graph["time_us"] < 9.77 * 1.3  # at the HBM floor: +25 % (docs/compute-model.md)
    assert fitted["time_us"] - graph["time_us"] > 10  # the fitted 13.1 us overhead less the 2 us gap
    assert graph["overrides"] == {"gpu.launch": "graph"}
