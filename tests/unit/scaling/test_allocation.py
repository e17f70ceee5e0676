"""The aimed night's allocation rule (``eagle3.scaling.allocation``): budget, floor, empty pools,
determinism, and where it aims."""

from __future__ import annotations

import math

import pytest

from eagle3.scaling.allocation import DomainState, allocate, domain_gain

RULE = {"floor": 0.1, "ceiling": 4.0}


def _domains() -> list[DomainState]:
    return [
        DomainState(
            "chat",
            pool_left=500,
            tokens_per_row=120,
            share=0.5,
            accept=2.9,
            points=((1000, 2.6), (4000, 2.9)),
            trained_tokens=4000,
        ),
        DomainState(
            "code",
            pool_left=300,
            tokens_per_row=200,
            share=0.3,
            accept=2.0,
            points=((1000, 1.6), (4000, 2.0)),
            trained_tokens=4000,
        ),
        DomainState("math", pool_left=40, tokens_per_row=60, share=0.2, accept=3.5),
        DomainState("empty", pool_left=0, tokens_per_row=80, share=0.0, accept=2.2),
    ]


def test_a_prompts_budget_is_spent_exactly():
    for budget in (1, 7, 100, 333):
        plan = allocate(_domains(), budget, unit="prompts", **RULE)
        assert sum(plan.rows().values()) == budget and plan.spent == budget


def test_a_tokens_budget_is_spent_until_no_further_row_fits():
    domains = _domains()
    for budget in (500, 12_345, 40_000):
        plan = allocate(domains, budget, unit="tokens", **RULE)
        assert plan.spent <= budget
        rows, costs = plan.rows(), {a.domain: a.cost for a in plan.allocations}
        for d in domains:
            assert costs[d.name] == pytest.approx(rows[d.name] * d.tokens_per_row)
            if rows[d.name] < d.pool_left:
                assert budget - plan.spent < d.tokens_per_row, (
                    f"another {d.name} row would have fit"
                )


def test_the_floor_holds_for_every_domain_with_prompts_left():
    domains = [
        # no share, no headroom
        DomainState("flat", pool_left=1000, tokens_per_row=100, share=0.0, accept=3.9),
        DomainState("hot", pool_left=1000, tokens_per_row=100, share=1.0, accept=1.2),
        DomainState("tiny", pool_left=3, tokens_per_row=100, share=0.0, accept=1.0),
    ]
    for unit, budget in (("prompts", 200), ("tokens", 20_000)):
        plan = allocate(domains, budget, unit=unit, floor=0.3, ceiling=4.0)
        rows = plan.rows()
        per_domain = 0.3 * budget / 3 / (1 if unit == "prompts" else 100)
        # the floor, or the whole pool when smaller
        assert rows["flat"] >= int(per_domain) and rows["tiny"] == 3
        assert "floor only" in next(a.why for a in plan.allocations if a.domain == "flat")


def test_a_domain_with_an_empty_pool_gets_nothing_and_the_plan_says_so():
    plan = allocate(_domains(), 100, unit="prompts", **RULE)
    (empty,) = [a for a in plan.allocations if a.domain == "empty"]
    assert empty.rows == 0 and empty.cost == 0 and empty.why.startswith("pool empty")
    assert "| empty | 0 |" in plan.markdown() and "pool empty" in plan.markdown()


def test_the_same_inputs_give_the_same_plan_whatever_their_order():
    first = allocate(_domains(), 250, unit="tokens", **RULE)
    again = allocate(list(reversed(_domains())), 250, unit="tokens", **RULE)
    assert first == again and first.markdown() == again.markdown()


def _flat_and_rising(flat_last: float) -> list[DomainState]:
    """Two domains of equal share and data after two nights: "flat" ends at ``flat_last`` from 2.0,
    "rising" went from 1.6 to 2.0."""
    return [
        DomainState(
            name,
            pool_left=1000,
            tokens_per_row=100,
            share=0.5,
            accept=2.0,
            points=((2000, first), (4000, last)),
            trained_tokens=4000,
        )
        for name, first, last in (("flat", 2.0, flat_last), ("rising", 1.6, 2.0))
    ]


def test_the_budget_goes_where_traffic_share_times_measured_gain_is_highest():
    # one domain's accept length stopped moving, the other's rises
    domains = _flat_and_rising(flat_last=2.0)
    plan = allocate(domains, 400, unit="prompts", **RULE)
    # flat: the floor (10% of 400 over 2 domains) and no more
    assert plan.rows() == {"flat": 20, "rising": 380}
    rising = next(a for a in plan.allocations if a.domain == "rising")
    assert (
        "measured +0.577/e-fold over 2 nights" in rising.why and "95% of the budget" in rising.why
    )


def test_a_domain_gains_no_more_than_its_headroom_and_unmeasured_ones_take_the_measured_median():
    noisy = DomainState(
        "d", pool_left=10, tokens_per_row=10, share=1, accept=3.8, points=((100, 1.0), (200, 3.8))
    )
    assert domain_gain(noisy, ceiling=4.0)[0] == pytest.approx(0.2)  # 4.0 - 3.8
    assert domain_gain(
        DomainState("d", 10, 10, 1, accept=2.0, points=((100, 2.0),)), ceiling=4.0
    ) == (None, "")
    # two measured (gains 0.2 and 0.6), a low one and a nearly saturated one not yet measured
    domains = [
        DomainState(
            "a", 100, 10, 0.25, accept=2.0, points=((100, 1.8), (200, 1.8 + 0.2 * math.log(2)))
        ),
        DomainState(
            "b", 100, 10, 0.25, accept=2.0, points=((100, 1.6), (200, 1.6 + 0.6 * math.log(2)))
        ),
        DomainState("low", 100, 10, 0.25, accept=1.1, points=((100, 1.1),)),
        DomainState("high", 100, 10, 0.25, accept=3.9, points=((100, 3.9),)),
    ]
    gains = {
        a.domain: (round(a.gain, 3), a.why)
        for a in allocate(domains, 100, unit="prompts", **RULE).allocations
    }
    # not its 2.9 of headroom
    assert gains["low"][0] == 0.4 and "median gain of the measured" in gains["low"][1]
    assert gains["high"][0] == 0.1 and "bounded by headroom 0.10" in gains["high"][1]


def test_pools_smaller_than_the_budget_are_taken_whole_and_the_plan_notes_the_rest():
    domains = [
        DomainState("a", pool_left=5, tokens_per_row=10, share=1),
        DomainState("b", 7, 10, 1),
    ]
    plan = allocate(domains, 100, unit="prompts", **RULE)
    assert plan.rows() == {"a": 5, "b": 7} and "88 prompts of the budget unspent" in plan.markdown()
    assert all(
        "whole pool left" in a.why and "nothing measured yet" in a.why for a in plan.allocations
    )


def test_pre_tokenized_rows_are_taken_whole_outside_the_budget():
    domains = [
        DomainState("chat", 100, 50, 1.0),
        DomainState("(pre-tokenized)", 30, 0.0, 0.0, free=True),
    ]
    plan = allocate(domains, 40, unit="prompts", **RULE)
    assert plan.rows() == {"chat": 40, "(pre-tokenized)": 30} and plan.spent == 40


def test_a_night_needs_a_positive_budget():
    with pytest.raises(ValueError, match="positive budget"):
        allocate(_domains(), 0, unit="prompts", **RULE)


def test_with_nothing_measured_the_night_is_the_uniform_night_rows_by_traffic_share_whatever_a_row_costs():
    # one point each, no slope: nothing to aim with; short answers must not draw the budget
    domains = [
        DomainState(
            "short",
            pool_left=500,
            tokens_per_row=10,
            share=0.5,
            accept=1.1,
            points=((100, 1.1),),
            trained_tokens=100,
        ),
        DomainState(
            "long",
            pool_left=500,
            tokens_per_row=80,
            share=0.5,
            accept=1.3,
            points=((800, 1.3),),
            trained_tokens=800,
        ),
        DomainState("rare", pool_left=500, tokens_per_row=40, share=0.25, accept=1.5),
    ]
    plan = allocate(domains, 3_000, unit="tokens", floor=0.0, ceiling=4.0)
    rows = plan.rows()
    assert abs(rows["short"] - rows["long"]) <= 1 and abs(rows["short"] - 2 * rows["rare"]) <= 2, (
        rows
    )
    assert all("nothing measured yet: rows by traffic share" in a.why for a in plan.allocations)


def test_the_floor_gives_a_domain_of_long_answers_a_row_even_when_its_share_costs_less_than_one():
    domains = [  # measured: "long" has no gain, so only the floor can give it data
        DomainState(
            "long",
            100,
            400,
            0.5,
            accept=1.2,
            points=((4000, 1.2), (8000, 1.2)),
            trained_tokens=8000,
        ),
        DomainState(
            "short", 100, 10, 0.5, accept=1.5, points=((100, 1.2), (200, 1.5)), trained_tokens=200
        ),
    ]
    # floor: 50 tokens a domain
    rows = allocate(domains, 1_000, unit="tokens", floor=0.1, ceiling=4.0).rows()
    assert rows["long"] == 1 and rows["short"] > 50
    # a row over budget
    assert allocate(domains, 300, unit="tokens", floor=0.1, ceiling=4.0).rows()["long"] == 0


def test_a_domain_gets_no_more_than_max_domain_share_and_the_table_says_the_cap_bound_it():
    # one gain dwarfs the other: uncapped it takes nearly all
    domains = _flat_and_rising(flat_last=2.05)
    free = allocate(domains, 400, unit="prompts", **RULE)
    capped = allocate(domains, 400, unit="prompts", max_share=0.6, **RULE)
    assert free.rows()["rising"] > 240 and capped.rows() == {"flat": 160, "rising": 240}
    bound = {row["domain"]: row["bound"] for row in capped.table()}
    assert (
        bound == {"flat": "gain", "rising": "cap"}
        and "max_domain_share=0.6" in capped.allocations[1].why
    )
    assert "| bound by |" in capped.markdown() and "| cap |" in capped.markdown()


def test_slopes_are_shrunk_by_their_standard_error_under_the_planners_noise_estimate():
    from eagle3.scaling.allocation import noise_estimate

    two = DomainState("two", 100, 10, 0.5, accept=2.0, points=((1000, 1.6), (4000, 2.0)))
    assert noise_estimate([two]) is None  # two points fit exactly: no residual, no estimate
    assert domain_gain(two, ceiling=4.0) == domain_gain(two, ceiling=4.0, noise=None)
    noisy = DomainState(
        "noisy", 100, 10, 0.5, accept=2.0, points=((1000, 1.7), (2000, 1.5), (4000, 1.9))
    )
    sigma, dof = noise_estimate([two, noisy])
    assert dof == 1 and sigma > 0
    raw, _ = domain_gain(noisy, ceiling=4.0)
    shrunk, why = domain_gain(noisy, ceiling=4.0, noise=sigma)
    assert 0 < shrunk < raw and "shrunk to" in why
    # the same slope over a wider span of data is known better, so it is shrunk less
    wide = DomainState(
        "wide", 100, 10, 0.5, accept=2.0, points=((1000, 1.6), (16000, 1.6 + raw * math.log(16)))
    )
    assert domain_gain(wide, ceiling=4.0, noise=sigma)[0] > shrunk
    plan = allocate([two, noisy], 100, unit="prompts", **RULE)
    assert any("Planner noise" in note and "1 degrees of freedom" in note for note in plan.notes)
    assert any(
        "No noise estimate yet" in n for n in allocate([two], 100, unit="prompts", **RULE).notes
    )
