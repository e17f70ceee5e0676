"""What the per-level measurement says about serving (``eagle3.gate.serving``): the crossover,
interpolated on log concurrency, and SGLang's adaptive tiers picked per level across the sweep's
step counts."""

from __future__ import annotations

import pytest

from eagle3.gate.serving import (
    StepResult,
    Tier,
    adaptive_tiers,
    crossover,
    initial_steps,
    sglang_config,
)


def test_the_crossover_is_interpolated_on_log_concurrency_and_marked_so():
    # log-symmetric around 1 (2x at 1, 0.5x at 4): the crossing is at the geometric midpoint, 2
    cross = crossover([(4, 0.5), (1, 2.0)])
    assert (
        cross.concurrency == pytest.approx(2.0) and cross.interpolated and cross.between == [1, 4]
    )
    assert (
        "~2.0 (interpolated on log concurrency between 1 at 2.00x and 4 at 0.50x)" in cross.summary
    )
    # a draft that barely pays at 1 crosses close to it
    assert crossover([(1, 1.1), (16, 0.5)]).concurrency == pytest.approx(
        16 ** (0.0953 / (0.0953 + 0.6931)), rel=1e-3
    )


def test_a_speedup_of_exactly_one_at_a_level_is_measured_not_interpolated():
    cross = crossover([(1, 1.4), (4, 1.0), (16, 0.7)])
    assert cross.concurrency == 4.0 and not cross.interpolated and "measured 1.00x" in cross.summary


@pytest.mark.parametrize(
    ("points", "needle"),
    [
        ([(1, 1.5), (4, 1.2), (16, 1.05)], "speedup >= 1 at every measured level (1..16)"),
        (
            [(1, 0.9), (4, 0.6)],
            "speedup below 1 from the first measured level (1..4): speculation pays at none",
        ),
        ([(1, 1.3)], "speedup >= 1 at every measured level (1 only)"),
    ],
)
def test_no_crossover_is_placed_outside_the_measured_levels(points, needle):
    cross = crossover(points)
    assert cross.concurrency is None and not cross.interpolated and needle in cross.summary


def test_a_speedup_that_pays_again_further_up_is_named():
    cross = crossover([(1, 1.3), (4, 0.8), (16, 1.1)])
    assert cross.between == [1, 4] and "faster again at concurrency 16" in cross.summary


def _arm(
    steps: int, speedup: float, lo: float | None = None, hi: float | None = None
) -> StepResult:
    return StepResult(steps, speedup, None if lo is None else [lo, hi])


def test_each_level_gets_a_tier_from_the_geometric_midpoint_below_it():
    tiers = adaptive_tiers(
        {1: [_arm(3, 1.5, 1.4, 1.6)], 4: [_arm(3, 1.2, 1.1, 1.3)], 16: [_arm(3, 0.7, 0.6, 0.8)]}
    )
    assert [(t.batch_size, t.concurrency) for t in tiers] == [(1, 1), (2, 4), (8, 16)]
    assert sglang_config(tiers) == {
        "1": {"candidate_steps": [3]},
        "2": {"candidate_steps": [3]},
        "8": {"candidate_steps": [0]},
    }


def test_a_tier_picks_the_fastest_sweep_setting_at_its_level():
    tiers = adaptive_tiers(
        {
            1: [_arm(3, 1.4, 1.3, 1.5), _arm(5, 1.6, 1.5, 1.7)],  # more steps pay at batch 1
            8: [_arm(3, 1.1, 1.05, 1.15), _arm(5, 0.95, 0.9, 1.0)],  # fewer at 8
        }
    )
    assert [t.candidate_steps for t in tiers] == [[5], [3]]
    assert "best 5 steps at 1.60x [1.50, 1.70], shown faster" in tiers[0].reason


def test_a_win_not_shown_lets_sglang_turn_drafting_off_and_a_loss_turns_it_off():
    tiers = adaptive_tiers(
        {1: [_arm(3, 1.05, 0.95, 1.15)], 4: [_arm(3, 0.98, 0.9, 1.06)], 16: [_arm(3, 1.2)]}
    )
    # no interval (one round): not shown either
    assert [t.candidate_steps for t in tiers] == [[0, 3], [0], [0, 3]]
    assert (
        "not shown faster" in tiers[0].reason
        and "no faster than the baseline: drafting off" in tiers[1].reason
    )
    (shown,) = adaptive_tiers({4: [_arm(3, 0.6, 0.5, 0.7)]})
    assert shown.candidate_steps == [0] and "slower than the baseline: drafting off" in shown.reason


def test_the_server_starts_at_the_first_drafting_tiers_steps_and_none_when_nothing_drafts():
    assert initial_steps([Tier(1, 1, [0], ""), Tier(2, 4, [0, 5], ""), Tier(8, 16, [3], "")]) == 5
    assert initial_steps([Tier(1, 1, [0], ""), Tier(2, 4, [0], "")]) is None
    # unmeasured levels get no tier
    assert adaptive_tiers({1: [], 4: [_arm(3, 1.2, 1.1, 1.3)]})[0].batch_size == 1
