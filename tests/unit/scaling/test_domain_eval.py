"""The planner's per-domain reader (``eagle3.scaling.domain_eval.read_by_set``) against the gate
report's ``by_set``."""

from __future__ import annotations

import pytest

from eagle3.gate.accept import SpecCounts, set_row
from eagle3.scaling.domain_eval import read_by_set


def test_the_gate_reports_by_set_entries_are_what_the_planner_reads():
    by_set = {
        "code": set_row([SpecCounts(completion_tokens=40, verify_ct=10), SpecCounts(30, 15)]),
        "chat": set_row([SpecCounts(completion_tokens=20, verify_ct=10)]),
    }
    read = read_by_set(by_set, rename={"code": "coding"})
    assert set(read) == {"coding", "chat"}
    assert read["coding"].accept_length == pytest.approx(70 / 25) and read["coding"].prompts == 2
    with pytest.raises(ValueError, match="lacks \\['spec_verify_ct'\\]"):
        read_by_set(
            {"chat": {"accept_length": 2.0, "completion_tokens": 20, "prompts": 1}},
            source="report.json",
        )
