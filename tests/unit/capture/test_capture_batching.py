"""Length-bucketed batches: every sample once, padded tokens bounded by capture.batch_tokens, little
padding."""

from __future__ import annotations

import random

from eagle3.capture.shard import Sample, admit, plan_batches


def test_batches_cover_each_sample_once_within_the_token_budget():
    rng = random.Random(0)
    lengths = [rng.randint(5, 900) for _ in range(500)]
    plan = plan_batches(lengths, 4096)
    flat = [i for batch in plan for i in batch]
    assert sorted(flat) == list(range(500))
    for batch in plan:
        assert len(batch) * max(lengths[i] for i in batch) <= 4096
    padded = sum(len(b) * max(lengths[i] for i in b) for b in plan)
    assert padded / sum(lengths) < 1.05  # sorting by length leaves little padding


def test_a_sample_longer_than_the_budget_gets_its_own_batch():
    plan = plan_batches([10, 5000, 20], 1000)
    assert [1] in plan and sorted(i for b in plan for i in b) == [0, 1, 2]


def test_admit_quarantines_bad_inputs():
    samples = [Sample("a", [], []), Sample("b", [1, 2], [1]), Sample("c", [1, 2, 3], [0, 1, 1])]
    keep, quarantined = admit(samples, max_seq_len=2, truncation="quarantine")
    assert keep == [] and [q["reason"] for q in quarantined] == [
        "bad_input",
        "bad_input",
        "too_long",
    ]
