"""Exact and near-duplicate detection, and decontamination against benchmark prompts."""

from __future__ import annotations

import json

import pytest

from eagle3.data.decontam import Decontaminator, load_prompt_sets
from eagle3.data.dedup import Deduper
from eagle3.data.normalize import sample_id

LONG = "Write a function that parses a CSV file with quoted fields and returns a list of dictionaries keyed by header"


def _sid(text):
    return sample_id([{"role": "user", "content": text}])


def test_exact_duplicate_is_dropped_and_first_occurrence_kept():
    d = Deduper(threshold=0.9, num_perm=64)
    assert d.check(_sid("hello there friend"), ["hello there friend"]) is None
    assert d.check(_sid("hello there friend"), ["hello there friend"]) == "duplicate"


def test_near_duplicate_is_dropped_but_different_prompts_are_kept():
    d = Deduper(threshold=0.8, num_perm=128)
    base = LONG + " and skips empty lines at the end of the file"
    near = LONG + " and skips empty lines at the end of the file."  # punctuation only
    near2 = base.replace("Write", "Please write")
    assert d.check(_sid(base), [base]) is None
    assert d.check(_sid(near), [near]) == "near_duplicate"
    assert d.check(_sid(near2), [near2]) == "near_duplicate"
    other = "Explain how photosynthesis turns light into chemical energy inside the leaves of green plants"
    assert d.check(_sid(other), [other]) is None


def test_rows_without_prompt_text_are_deduped_on_ids_only():
    d = Deduper(threshold=0.9, num_perm=64)
    assert d.check(sample_id([], [1, 2]), []) is None
    assert d.check(sample_id([], [1, 3]), []) is None
    assert d.check(sample_id([], [1, 2]), []) == "duplicate"


@pytest.fixture
def decon():
    return Decontaminator(
        [("code/1", LONG), ("chat/2", "How can I sleep better at night?")], ngram=13, threshold=0.5
    )


def test_long_benchmark_prompt_inside_a_longer_turn_is_contaminated(decon):
    assert decon.match(["Hi! " + LONG + " Thanks a lot."]) == "code/1"
    assert decon.match(["Write a function that parses a CSV file"]) is None


def test_short_benchmark_prompt_matches_only_a_near_identical_turn(decon):
    assert decon.match(["How can I sleep better at night?"]) == "chat/2"
    assert decon.match(["how can i sleep better at night"]) == "chat/2"
    assert (
        decon.match(["How can I sleep better at night? I am 23 years old and work shifts."]) is None
    )


def test_prompt_sets_load_local_files_and_skip_hub_entries(tmp_path, caplog):
    path = tmp_path / "bench.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "p"}) + "\n")
    with caplog.at_level("WARNING"):
        rows = load_prompt_sets({"chat": str(path), "math": "hub:gsm8k"})
    assert rows == [("chat/a", "p")] and "hub:gsm8k" in caplog.text
    with pytest.raises(FileNotFoundError, match=r"gate\.prompt_sets\.x"):
        load_prompt_sets({"x": str(tmp_path / "missing.jsonl")})
