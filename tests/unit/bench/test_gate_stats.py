"""The gate's statistic (``eagle3.bench.stats``): Student-t quantiles against table values, and the interval of
paired ratios on the log scale."""

from __future__ import annotations

import math
import random

import pytest

from eagle3.bench.stats import ratio_interval, t_cdf, t_quantile


@pytest.mark.parametrize(
    ("p", "df", "table"),
    [(0.95, 1, 6.313752), (0.95, 2, 2.919986), (0.975, 4, 2.776445), (0.95, 7, 1.894579), (0.995, 30, 2.749996)],
)
def test_t_quantile_matches_the_table(p, df, table):
    assert t_quantile(p, df) == pytest.approx(table, abs=1e-5)
    assert t_quantile(1 - p, df) == pytest.approx(-table, abs=1e-5)
    assert t_cdf(table, df) == pytest.approx(p, abs=1e-7)


def test_a_slowdown_and_the_matching_speedup_are_equally_far_from_one():
    up = ratio_interval([1.25, 1.2, 1.3], 0.9)
    down = ratio_interval([1 / 1.25, 1 / 1.2, 1 / 1.3], 0.9)
    assert up.estimate == pytest.approx(1 / down.estimate)
    assert up.lo == pytest.approx(1 / down.hi) and up.hi == pytest.approx(1 / down.lo)


def test_the_interval_covers_the_true_ratio_about_as_often_as_its_confidence_says():
    rng = random.Random(0)
    trials, covered = 2000, 0
    for _ in range(trials):
        interval = ratio_interval([1.1 * rng.lognormvariate(0, 0.05) for _ in range(4)], 0.9)
        covered += interval.lo <= 1.1 <= interval.hi
    assert 0.88 <= covered / trials <= 0.92


def test_more_rounds_narrow_the_interval_and_one_round_gives_none():
    rng = random.Random(1)
    ratios = [1.1 * rng.lognormvariate(0, 0.05) for _ in range(16)]
    narrow, wide = ratio_interval(ratios, 0.9), ratio_interval(ratios[:3], 0.9)
    assert narrow.hi - narrow.lo < wide.hi - wide.lo
    assert ratio_interval([1.2], 0.9) is None
    with pytest.raises(ValueError, match="positive and finite"):
        ratio_interval([1.0, 0.0], 0.9)
    assert math.isclose(ratio_interval([1.2, 1.2], 0.9).lo, 1.2)  # no spread seen: nothing widens it
