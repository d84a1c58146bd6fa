"""System files are complete or say what they inherit from; a preset's GPU count is the
system's unless it scales; the error contract of the ``cais`` command (exit codes,
one line); the size limits."""

import json

import pytest

from cais.cli import main
from cais.errors import UserError
from cais.config import ConfigError, SystemConfig, list_systems, load_system, missing_field
from cais.workload.models import ModelError


@pytest.mark.parametrize("name", sorted(list_systems()))
def test_every_preset_gives_every_field(name) -> None:
    from cais.config import _presets_dir

    data = json.loads((_presets_dir() / f"{name}.json").read_text())
    assert "base" not in data
    assert missing_field(data) is None
    assert load_system(name).name == name


def test_missing_field_walks_every_section() -> None:
    full = load_system("dgx-h100").model_dump(mode="json")
    assert missing_field(full) is None
    for section in ("gpu", "switch", "cais", "gpu_slowdown"):
        part = {k: v for k, v in full.items() if k != section}
        assert missing_field(part) == section
    nested = {**full, "switch": {k: v for k, v in full["switch"].items() if k != "merge"}}
    assert missing_field(nested) == "switch.merge"
    deeper = {**full, "switch": {**full["switch"], "merge": {"entries": 320}}}
    assert missing_field(deeper) == "switch.merge.line_bytes"
    assert missing_field({}, SystemConfig) == "name"


def test_a_file_with_a_base_inherits_field_by_field(tmp_path) -> None:
    path = tmp_path / "slow.json"
    path.write_text(json.dumps({"base": "dgx-h100", "link": {"bandwidth_GBps": 10},
                                "switch": {"merge": {"entries": 40}}}))
    cfg = load_system(str(path))
    ref = load_system("dgx-h100")
    assert cfg.name == "slow" and "dgx-h100" in cfg.description
    assert cfg.link.bandwidth_GBps == 10 and cfg.link.vc_depth_flits == ref.link.vc_depth_flits
    assert cfg.switch.merge.entries == 40 and cfg.switch.merge.line_bytes == ref.switch.merge.line_bytes
    assert cfg.switch.links_per_gpu == ref.switch.links_per_gpu
    assert cfg.packet == ref.packet  # the preset's NVLink format, not the built-in defaults
    untouched = set(SystemConfig.model_fields) - {"name", "description", "link", "switch"}
    assert all(getattr(cfg, k) == getattr(ref, k) for k in untouched)


def test_a_file_with_a_base_may_set_more_gpus(tmp_path) -> None:
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"base": "dgx-h100", "name": "big", "gpus": 16}))
    assert load_system(str(path)).gpus == 16


def test_a_complete_file_without_base_loads(tmp_path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**load_system("dgx-h200").model_dump(mode="json"), "name": "mine"}))
    assert load_system(str(path)).gpu.hbm_bandwidth_GBps == 4800


@pytest.mark.parametrize("content,says", [
    ({"name": "x"}, "missing field 'description'"),
    ({"base": "dgx-h100", "gpuz": 8}, "unknown field 'gpuz'"),
    ({"base": 7}, "field 'base'"),
    ("[1, 2]", "expected a JSON object"),
    ('"dgx-h100"', "got a JSON string"),
])
def test_bad_system_files_are_one_line_errors(tmp_path, content, says) -> None:
    path = tmp_path / "s.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ConfigError, match=says) as e:
        load_system(str(path))
    assert "\n" not in str(e.value)


def test_a_path_that_does_not_exist_is_file_not_found(tmp_path) -> None:
    for arg in (str(tmp_path / "nosuch.json"), "sub/dir/system", "mine.json"):
        with pytest.raises(ConfigError, match="file not found"):
            load_system(arg)
    with pytest.raises(ConfigError, match="unknown system 'dgx-a100'"):
        load_system("dgx-a100")


def test_gpus_beyond_a_preset_that_does_not_scale_is_an_error() -> None:
    assert not load_system("dgx-h100").scalable
    with pytest.raises(ConfigError, match="has 8 GPUs and is not scalable.*h100-nvswitch"):
        load_system("dgx-h100", gpus=16)
    assert load_system("dgx-h100", gpus=4).gpus == 4  # fewer of its GPUs: a smaller TP group on the same fabric
    assert load_system("h100-nvswitch", gpus=16).gpus == 16
    assert load_system("dgx-h100").with_overrides(gpus=16).gpus == 16  # Python-level overrides stay free


def test_user_errors_share_one_base() -> None:
    from cais.cli import UsageError

    for cls in (ConfigError, ModelError, UsageError):
        assert issubclass(cls, UserError) and issubclass(cls, ValueError)


def test_a_bug_is_an_internal_error_with_exit_1_not_2(monkeypatch, capsys) -> None:
    import cais.cli as cli

    def broken(args):
        raise ValueError("an invariant broke\nsecond line")
    monkeypatch.setattr(cli, "cmd_systems", broken)
    monkeypatch.delenv("CAIS_DEBUG", raising=False)
    assert main(["systems"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("cais: internal error: ValueError: an invariant broke second line (please report this")
    monkeypatch.setenv("CAIS_DEBUG", "1")
    with pytest.raises(ValueError, match="invariant"):
        main(["systems"])


def test_the_limit_moves_with_the_environment(monkeypatch, capsys) -> None:
    monkeypatch.setenv("CAIS_MAX_EVENTS", "1000")
    assert main(["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "1M"]) == 2
    assert "beyond the limit of 1,000" in capsys.readouterr().err
    monkeypatch.setenv("CAIS_MAX_EVENTS", "1e9")
    assert main(["collective", "--op", "allreduce", "--algo", "nvls", "--bytes", "64K", "--json"]) == 0


def test_the_estimates_cover_the_measured_runs() -> None:
    """The estimates are upper-ish bounds of the event counts measured for
    docs/errors.md: a collective within 2x above, a period at or above."""
    from cais.experiments.collective import run_collective
    from cais.experiments.layer import run_layer
    from cais.experiments.estimates import collective_events, period_events
    from cais.schemes import get_scheme
    from cais.workload.graph import build_period
    from cais.workload.models import load_model

    cfg = load_system("dgx-h100")
    for algo in ("nvls", "ring"):
        r = run_collective(cfg, "allreduce", algo, 16 << 20)
        assert r.events <= collective_events(cfg, "allreduce", algo, 16 << 20) <= 2 * r.events
    small = cfg.with_overrides(gpus=4)
    model = load_model("paper-mega-gpt-4b").with_run(batch=2, seq=512)
    for scheme in ("tp-nvls", "cais"):
        sch = get_scheme(scheme)
        r = run_layer(small, model, scheme, "prefill", 33)
        est = period_events(small, build_period(model, 4, "prefill", sch.sp), model.dtype_bytes, sch.switch)
        assert r.events <= est
