"""A collective algorithm is one registration (kernels/algorithms.py): once a module
registers an :class:`Algorithm`, the command line, sweeps, the collective runner,
the event estimates and the layer's barriers all know it, with nothing else to edit.
A fixture algorithm shows it: NCCL's ring kernels on two channels, AllGather only."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cais.errors import UserError
from cais.experiments.collective import run_collective
from cais.experiments.estimates import collective_events
from cais.config import load_system
from cais.kernels.algorithms import ALGORITHMS, Algorithm, algorithm, names, register, unregister
from cais.kernels.collectives import ring_kernels


@pytest.fixture
def two_channel_ring():
    algo = register(Algorithm("ring-2ch", ("allgather",), ("simple",), nccl=False, barriers=False,
                              channels=lambda cfg: 2, events_per_train=7,
                              build=lambda m, spec: ring_kernels(m, replace(spec, channels=2))))
    yield algo
    unregister(algo.name)
    assert "ring-2ch" not in ALGORITHMS


def test_a_registered_algorithm_runs_everywhere_an_algorithm_is_named(two_channel_ring, capsys) -> None:
    from cais.cli import main
    from cais.sweep.point import prepare

    assert "ring-2ch" in names() and "ring-2ch" not in names(nccl=True)
    cfg = load_system("dgx-h100").with_overrides(gpus=4)
    r = run_collective(cfg, "allgather", "ring-2ch", 64 << 10, functional=True)
    assert r.correct and r.algo == "ring-2ch"
    assert collective_events(cfg, "allgather", "ring-2ch", 1 << 20) > 0
    assert prepare({"kind": "collective", "op": "allgather", "algo": "ring-2ch", "bytes": 65536}).algo == "ring-2ch"
    assert main(["collective", "--op", "allgather", "--algo", "ring-2ch", "--bytes", "64K", "--gpus", "4"]) == 0
    assert "ring-2ch" in capsys.readouterr().out
    with pytest.raises(UserError, match=r"^op: algorithm 'ring-2ch' runs allgather; got 'allreduce'$"):
        run_collective(cfg, "allreduce", "ring-2ch", 64 << 10)


def test_unknown_names_and_protocols_are_user_errors() -> None:
    with pytest.raises(UserError, match=r"^algo: unknown algorithm 'tree'; valid: ring, nvls, "):
        algorithm("tree")
    with pytest.raises(UserError, match=r"^protocol: 'nvls' runs simple; got 'll'$"):
        algorithm("nvls").check("allreduce", "ll")
    assert algorithm("nvls").barriers and not algorithm("ring").barriers


def test_the_config_takes_its_replacement_policies_from_the_core() -> None:
    """``switch.merge.replacement`` accepts exactly the policies the compiled core
    registers (rust/src/hw/replacement/: a file and its line in POLICIES); nothing on
    the Python side lists them."""
    from cais._core import replacement_policies
    from cais.config import ConfigError, apply_overrides

    cfg = load_system("dgx-h100")
    assert replacement_policies()[0] == cfg.switch.merge.replacement == "lru"
    for name in replacement_policies():
        assert apply_overrides(cfg, {"switch.merge.replacement": name}).switch.merge.replacement == name
    with pytest.raises(ConfigError, match=r"switch\.merge\.replacement.*'lru' or 'fifo'") as e:
        apply_overrides(cfg, {"switch.merge.replacement": "mru"})
    assert "\n" not in str(e.value)
