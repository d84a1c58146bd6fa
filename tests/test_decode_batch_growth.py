"""The batch-padding what-if beside the decode rows (scripts/decode_batch_growth.py):
vLLM 0.6's graph batches, the padded step (the graph's contents at the padded batch, the
rest of the tail at the real one) and ours' all-reduce per call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def dbg(load_script: Callable[[str], ModuleType]) -> ModuleType:
    return load_script("decode_batch_growth")


def test_graph_batches_are_vllm_06s_captured_sizes(dbg: ModuleType) -> None:
    got = {b: dbg.graph_batch(b) for b in (1, 2, 3, 4, 5, 6, 8, 9, 17)}
    assert got == {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 6: 8, 8: 8, 9: 16, 17: 24}
    with pytest.raises(ValueError):
        dbg.graph_batch(0)


def test_the_padded_step_runs_the_graph_at_8_and_the_sampler_at_6(dbg: ModuleType) -> None:
    vt = dbg._validate_token()
    row = next(r for r in vt.rows() if r.use == "held-out" and r.batch == 6)
    real, padded = vt.ours(row), vt.ours(replace(row, batch=dbg.graph_batch(row.batch)))
    assert padded.tokens == 8 and real.tokens == 6  # the path under test ran two batches
    t = dbg.padded_token_us(real, padded)
    assert real.token is not None and padded.token is not None
    assert real.token.token_us < t < padded.token.token_us  # lm_head, gather, sampler stay at 6
    outside = sum(v for k, v in real.token.tail.items() if k not in dbg.IN_GRAPH_TAIL)
    inside = sum(padded.token.tail[k] for k in dbg.IN_GRAPH_TAIL)
    assert t == pytest.approx(padded.token.layers * padded.token.layer_us + inside + outside)
    assert dbg.padded_token_us(real, real) == pytest.approx(real.token.token_us)


def test_ours_all_reduce_per_call_grows_with_the_tokens(dbg: ModuleType) -> None:
    vt = dbg._validate_token()
    row = next(r for r in vt.rows() if r.use in vt.SCORED and r.batch == 1)
    one, eight = vt.ours(row), vt.ours(replace(row, batch=8))
    assert sum(one.collectives_ran.values()) == 2  # two all-reduces a layer
    assert 0 < dbg.all_reduce_per_call_us(one) < dbg.all_reduce_per_call_us(eight)
