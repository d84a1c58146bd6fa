"""The batch-padding share of the larger-batch decode rows (scripts/decode_batch_growth.py):
the rows run the graph of their captured batch (``decode.graph_padding``), the padding
off runs their own batch, and ours' all-reduce per call grows with the tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def dbg(load_script: Callable[[str], ModuleType]) -> ModuleType:
    return load_script("decode_batch_growth")


def test_the_batch_6_rows_run_the_graph_of_8_and_the_padding_off_their_own(dbg: ModuleType) -> None:
    vt = dbg._validate_token()
    rows = [r for r in vt.rows() if r.use == "held-out" and r.batch == 6]
    assert rows  # the path under test: both models' batch-6 rows
    for row in rows:
        on, off = vt.ours(row), vt.ours(row, sets={"decode.graph_padding": "false"})
        assert on.token is not None and off.token is not None
        assert (on.tokens, on.padded_tokens, on.token.graph_batch) == (6, 8, 8)
        assert (off.padded_tokens, off.token.graph_batch) == (6, 0)
        assert dbg.token_us(on) > dbg.token_us(off)  # the padding rows cost


def test_a_captured_batch_runs_as_it_is(dbg: ModuleType) -> None:
    vt = dbg._validate_token()
    row = next(r for r in vt.rows() if r.use == "held-out" and r.batch == 4)
    on, off = vt.ours(row), vt.ours(row, sets={"decode.graph_padding": "false"})
    assert on.token is not None and on.token.graph_batch == 0 and dbg.token_us(on) == dbg.token_us(off)


def test_ours_all_reduce_per_call_grows_with_the_tokens(dbg: ModuleType) -> None:
    vt = dbg._validate_token()
    row = next(r for r in vt.rows() if r.use in vt.SCORED and r.batch == 1)
    one, eight = vt.ours(row), vt.ours(replace(row, batch=8))
    assert sum(one.collectives_ran.values()) == 2  # two all-reduces a layer
    assert 0 < dbg.all_reduce_per_call_us(one) < dbg.all_reduce_per_call_us(eight)
