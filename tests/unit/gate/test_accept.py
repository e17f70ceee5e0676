"""Speculative counters across SGLang releases: the server's own accept length preferred, its source
named."""

from __future__ import annotations

import pytest

from eagle3.gate.accept import ACCEPT_LENGTH_FIELD, COMPUTED, SpecCounts, pool
from eagle3.gate.prompts import RequestResult
from eagle3.gate.report import ArmResult, LevelStats


def _meta_0_5_23(completion: int, verify: int, correct: int, hist: list[int]) -> dict:
    """A speculative answer's meta_info as SGLang 0.5.23's TokenizerManager writes it (3 draft
    tokens per verify)."""
    return {
        "completion_tokens": completion,
        "spec_verify_ct": verify,
        "spec_accept_length": completion / verify,
        "spec_accept_rate": correct / (3 * verify),
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": 3 * verify,
        "spec_correct_drafts_histogram": hist,
    }


def test_sglang_0_5_23_fields_give_the_servers_accept_length_rate_and_histogram():
    counts = [
        SpecCounts.of(_meta_0_5_23(30, 10, 18, [2, 3, 5])),
        SpecCounts.of(_meta_0_5_23(12, 6, 5, [3, 1, 2])),
    ]
    summary = pool(counts)
    assert summary.source == ACCEPT_LENGTH_FIELD
    # verify-weighted, the pooled tokens per verify pass
    assert summary.accept_length == pytest.approx(42 / 16)
    assert summary.accept_rate == pytest.approx(23 / 48)
    assert summary.histogram == [5, 4, 7]
    assert set(summary.fields) == {
        "spec_verify_ct",
        "spec_accept_length",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
        "spec_correct_drafts_histogram",
    }


def test_the_servers_own_accept_length_wins_over_the_computed_one():
    # a release not counting prefill
    meta = {"completion_tokens": 31, "spec_verify_ct": 10, "spec_accept_length": 3.0}
    assert pool([SpecCounts.of(meta)]).accept_length == pytest.approx(3.0)
    assert pool(
        [SpecCounts.of({"completion_tokens": 31, "spec_verify_ct": 10})]
    ).accept_length == pytest.approx(3.1)


@pytest.mark.parametrize(
    ("accepted", "proposed", "histogram"),
    [
        ("spec_accept_token_num", "spec_draft_token_num", None),
        ("spec_accepted_drafts", "spec_proposed_drafts", "spec_accept_histogram"),
    ],
)
def test_older_releases_and_aliases_are_read_and_named(accepted, proposed, histogram):
    meta = {"completion_tokens": 20, "spec_verify_ct": 8, accepted: 12, proposed: 24}
    if histogram:
        meta[histogram] = [1, 2, 5]
    summary = pool([SpecCounts.of(meta)])
    assert summary.source == COMPUTED and summary.accept_length == pytest.approx(2.5)
    assert summary.accept_rate == pytest.approx(0.5)
    assert summary.histogram == ([1, 2, 5] if histogram else None)
    assert {accepted, proposed} <= set(summary.fields)


def test_one_answer_without_the_servers_number_makes_the_level_computed():
    counts = [
        SpecCounts.of(_meta_0_5_23(30, 10, 18, [2, 3, 5])),
        SpecCounts.of({"completion_tokens": 9, "spec_verify_ct": 3}),
    ]
    summary = pool(counts)
    assert summary.source == COMPUTED and summary.accept_length == pytest.approx(39 / 13)
    assert summary.accept_rate is None and summary.histogram is None


def test_a_plain_server_has_no_speculative_counters():
    summary = pool([SpecCounts.of({"completion_tokens": 9})])
    assert summary.accept_length is None and summary.source is None and summary.verify_ct == 0


def test_rounds_pool_like_answers_and_keep_the_source():
    rounds = []
    for r, metas in enumerate(
        [[_meta_0_5_23(30, 10, 18, [2, 3, 5])], [_meta_0_5_23(12, 6, 5, [3, 1, 2])]]
    ):
        results = [
            RequestResult(
                f"p{r}",
                completion_tokens=m["completion_tokens"],
                spec=SpecCounts.of(m),
                latency_s=1.0,
            )
            for m in metas
        ]
        level = LevelStats.of(1, results, 1.0)
        level.round = r
        rounds.append(level)
    arm = ArmResult("cand", "candidate", "http://x", rounds=rounds)
    arm.pool()
    (level,) = arm.levels
    assert level.accept_source == ACCEPT_LENGTH_FIELD and level.accept_length == pytest.approx(
        42 / 16
    )
    assert level.accept_rate == pytest.approx(23 / 48) and level.accept_histogram == [5, 4, 7]
