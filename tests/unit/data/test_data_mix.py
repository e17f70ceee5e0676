"""Mix plan (weights, caps, water filling) and exact, deterministic row selection."""

from __future__ import annotations

from eagle3.data.mix import Selector, plan_mix


def _planned(lines):
    return {line.source: line.planned for line in lines}


def test_no_total_takes_everything_up_to_each_cap():
    lines = plan_mix([("a", 100, 1.0, None), ("b", 50, 1.0, 20)], total=None)
    assert _planned(lines) == {"a": 100, "b": 20}


def test_total_is_split_by_weight():
    assert _planned(plan_mix([("a", 10_000, 3.0, None), ("b", 10_000, 1.0, None)], total=1000)) == {
        "a": 750,
        "b": 250,
    }


def test_capped_sources_give_their_share_to_the_others():
    lines = plan_mix(
        [("a", 100, 1.0, None), ("b", 10_000, 1.0, None), ("c", 10_000, 1.0, 50)], total=900
    )
    assert _planned(lines) == {"a": 100, "b": 750, "c": 50}
    assert sum(_planned(lines).values()) == 900


def test_plan_is_exact_with_rounding_and_never_exceeds_availability():
    lines = plan_mix(
        [("a", 1000, 1.0, None), ("b", 1000, 1.0, None), ("c", 1000, 1.0, None)], total=100
    )
    assert sum(line.planned for line in lines) == 100
    small = plan_mix([("a", 5, 1.0, None), ("b", 3, 2.0, None)], total=1000)
    assert _planned(small) == {"a": 5, "b": 3}


def _select(available, planned, seed, source="s"):
    sel = Selector(available=available, planned=planned, seed=seed, source=source)
    return [i for i in range(available) if sel.take()]


def test_selection_takes_exactly_planned_rows_deterministically_per_seed():
    first = _select(1000, 137, seed=0)
    assert len(first) == 137 and first == _select(1000, 137, seed=0)
    assert first != _select(1000, 137, seed=1)
    assert _select(10, 10, seed=0) == list(range(10))
