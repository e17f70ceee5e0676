"""The gate's statistic (``eagle3.gate.stats``): Student-t quantiles against table values, and the
interval of paired ratios on the log scale."""

from __future__ import annotations

import math
import random

import pytest

from eagle3.gate.stats import (
    ratio_interval,
    t_cdf,
    t_quantile,
    weighted_interval,
    weighted_log_ratios,
)


@pytest.mark.parametrize(
    ("p", "df", "table"),
    [
        (0.95, 1, 6.313752),
        (0.95, 2, 2.919986),
        (0.975, 4, 2.776445),
        (0.95, 7, 1.894579),
        (0.995, 30, 2.749996),
    ],
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
    # no spread seen: nothing widens it
    assert math.isclose(ratio_interval([1.2, 1.2], 0.9).lo, 1.2)


def test_the_weighted_interval_is_the_t_interval_of_each_rounds_weighted_log_speedup():
    levels = {1: {0: 1.5, 1: 1.4, 2: 1.6}, 4: {0: 0.6, 1: 0.55, 2: 0.62}}
    shares = {1: 0.75, 4: 0.25}
    per_round = [0.75 * math.log(levels[1][r]) + 0.25 * math.log(levels[4][r]) for r in range(3)]
    assert weighted_log_ratios(levels, shares) == pytest.approx(per_round)
    mean = sum(per_round) / 3
    sd = math.sqrt(sum((y - mean) ** 2 for y in per_round) / 2)
    half = t_quantile(0.95, 2) * sd / math.sqrt(3)
    got = weighted_interval(levels, shares, 0.9)
    assert (got.lo, got.estimate, got.hi) == pytest.approx(
        (math.exp(mean - half), math.exp(mean), math.exp(mean + half))
    )
    # the centre is the weighted geometric mean of the levels' own geometric means
    geo = {c: ratio_interval(list(r.values()), 0.9).estimate for c, r in levels.items()}
    assert got.estimate == pytest.approx(geo[1] ** 0.75 * geo[4] ** 0.25)


def test_a_level_without_share_plays_no_part_and_a_round_missing_a_weighed_level_is_left_out():
    levels = {1: {0: 1.5, 1: 1.4, 2: 1.6}, 4: {0: 0.6, 2: 0.62}, 16: {0: 0.1, 1: 0.2, 2: 0.3}}
    # round 1 has no ratio at 4
    assert len(weighted_log_ratios(levels, {1: 0.5, 4: 0.5, 16: 0.0})) == 2
    only_one = weighted_interval(levels, {1: 1.0, 4: 0.0, 16: 0.0}, 0.9)
    assert only_one == ratio_interval(list(levels[1].values()), 0.9)


def test_the_weighted_interval_covers_the_profile_speedup_when_the_levels_of_a_round_share_its_noise():
    """A round slower or faster for every level at once (the machine): the per-round combination
    keeps that covariance, so the interval still covers about as often as its confidence says."""
    rng = random.Random(2)
    true = {1: 1.4, 4: 0.7}
    shares = {1: 0.6, 4: 0.4}
    target = math.exp(sum(w * math.log(true[c]) for c, w in shares.items()))
    trials, covered = 2000, 0
    for _ in range(trials):
        levels: dict[int, dict[int, float]] = {1: {}, 4: {}}
        for r in range(4):
            shared = rng.gauss(0, 0.05)  # the round's machine state, seen by both levels
            for c in levels:
                levels[c][r] = true[c] * math.exp(shared + rng.gauss(0, 0.02))
        interval = weighted_interval(levels, shares, 0.9)
        covered += interval.lo <= target <= interval.hi
    assert 0.88 <= covered / trials <= 0.92
