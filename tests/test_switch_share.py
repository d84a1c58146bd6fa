"""The switch's share of CAIS's gain (issue 57, cais.reproduce.switch_share): its
arithmetic on a hand-made Fig. 11 frame, and the verdict's sentence."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from cais.reproduce.switch_share import share_words, switch_share, switch_share_lines


def _rows() -> pd.DataFrame:
    times = {("A", "prefill"): {"tp-nvls": 1.5, "cais-sw": 1.1, "cais": 1.0, "t3": 9.0},
             ("B", "prefill"): {"tp-nvls": 4.0, "cais-sw": 2.4, "cais": 2.0},
             ("A", "train"): {"tp-nvls": 3.0, "cais": 2.0}}  # no cais-sw: train is left out
    return pd.DataFrame([{"model": m, "mode": mode, "scheme": s, "total_us": t}
                         for (m, mode), by in times.items() for s, t in by.items()])


def test_the_share_is_the_log_ratio_of_the_geomeans() -> None:
    s = switch_share(_rows())
    assert list(s["mode"]) == ["prefill"]
    r = s.iloc[0]
    assert r["over TP-NVLS"] == pytest.approx(math.sqrt(1.5 * 2.0))  # geomean of 1.5/1 and 4/2
    assert r["over cais-sw"] == pytest.approx(math.sqrt(1.1 * 1.2))
    assert r["switch share"] == pytest.approx(math.log(1.32) / math.log(3.0))  # 0.2527


def test_software_faster_than_cais_is_a_negative_share_and_no_gain_has_no_share() -> None:
    df = pd.DataFrame({"model": ["A"] * 3, "mode": ["prefill"] * 3, "scheme": ["tp-nvls", "cais-sw", "cais"],
                       "total_us": [2.0, 0.9, 1.0]})
    assert switch_share(df).iloc[0]["switch share"] < 0
    for tp in (1.0, 0.9):  # no gain over TP-NVLS, or a loss: no share of it
        df["total_us"] = [tp, 1.1, 1.0]
        assert math.isnan(switch_share(df).iloc[0]["switch share"])
    assert switch_share(df).iloc[0]["over cais-sw"] == pytest.approx(1.1)
    assert switch_share(df.iloc[0:0]).empty


def test_the_lines_name_each_world_in_plain_words() -> None:
    lines = switch_share_lines([("dgx-h100 (as sold)", _rows()), ("paper-world", _rows().iloc[0:0])])
    assert lines == ["dgx-h100 (as sold), prefill: in-switch merging makes CAIS 1.15x faster than its software "
                     "alone (cais-sw): 25 % of its 1.73x over TP-NVLS (log scale)."]
    assert switch_share_lines([("paper-world", _rows().iloc[0:0])]) == []
    assert "1.05x slower than its software alone" in share_words(1 / 1.05, 1.19, -0.28)  # no negative percentage
    assert "under 0.5 %" in share_words(1.001, 1.19, 0.01)
    assert "more than its 1.18x over TP-NVLS: the software alone is 0.98x TP-NVLS" in share_words(1.21, 1.18, 1.15)
