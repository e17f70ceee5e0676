"""Gate report: level statistics, decision rules on measured arms (three identical rounds each: the
interval has no width, so the rules act as on one number), and the report files."""

from __future__ import annotations

import pytest

from eagle3.config.gate import GateConfig
from eagle3.gate.accept import SpecCounts
from eagle3.gate.prompts import RequestResult
from eagle3.gate.report import FAIL, ArmResult, GateReport, LevelStats, read_report, write_report
from eagle3.gate.verdict import decide


def test_accept_length_is_total_tokens_over_total_verify_passes():
    results = [
        RequestResult(
            "a",
            completion_tokens=30,
            spec=SpecCounts(completion_tokens=30, verify_ct=10),
            latency_s=1.0,
        ),
        RequestResult(
            "b",
            completion_tokens=10,
            spec=SpecCounts(completion_tokens=10, verify_ct=10),
            latency_s=0.5,
        ),
    ]
    lv = LevelStats.of(4, results, duration_s=2.0)
    # not the mean of per-request ratios (2.0 vs 3 and 1)
    assert lv.accept_length == pytest.approx(40 / 20)
    assert lv.output_tok_s == pytest.approx(20.0)
    assert lv.tpot_ms == pytest.approx(1000 * (1 / 30 + 0.5 / 10) / 2)


def test_baseline_without_verify_passes_has_no_accept_length():
    assert (
        LevelStats.of(
            1, [RequestResult("a", completion_tokens=5, latency_s=1.0)], 1.0
        ).accept_length
        is None
    )


def _arm(name, role, tok_s, accept=None, draft=None):
    verify = int(100 / accept) if accept else 0
    rounds = [
        LevelStats(1, 4, 100, verify, 100 / tok_s, tok_s, 10.0, accept, round=r) for r in range(3)
    ]
    arm = ArmResult(name, role, "http://x", draft=draft, rounds=rounds)
    arm.pool()
    return arm


def test_pooled_rounds_sum_tokens_and_time():
    arm = ArmResult(
        "a",
        "candidate",
        "http://x",
        rounds=[
            LevelStats(1, 4, 100, 50, 1.0, 100.0, 10.0, 2.0, round=0),
            LevelStats(1, 4, 300, 100, 2.0, 150.0, 20.0, 3.0, round=1),
        ],
    )
    arm.pool()
    (lv,) = arm.levels
    assert lv.output_tok_s == pytest.approx(400 / 3.0) and lv.accept_length == pytest.approx(
        400 / 150
    )
    assert lv.requests == 8 and lv.tpot_ms == pytest.approx(15.0) and lv.round is None


GATE = GateConfig(traffic={1: 1.0}, min_speedup=1.05, min_accept=1.5, min_gain_over_champion=1.02)


def test_slower_than_baseline_is_refused_even_with_a_good_accept_length():
    arms = [
        _arm("baseline", "baseline", 90.0),
        _arm("cand0", "candidate", 82.3, accept=2.5, draft="d"),
    ]
    (d,) = decide(arms, GATE)
    assert d.verdict == FAIL and d.speedup == pytest.approx(82.3 / 90)
    assert any("min_speedup" in r for r in d.reasons)


def test_accept_length_near_one_is_refused_even_when_faster():
    arms = [
        _arm("baseline", "baseline", 90.0),
        _arm("cand0", "candidate", 100.0, accept=1.0, draft="d"),
    ]
    (d,) = decide(arms, GATE)
    assert d.verdict == FAIL and any("min_accept" in r for r in d.reasons)


def test_candidate_must_also_beat_the_champion():
    arms = [
        _arm("baseline", "baseline", 90.0),
        _arm("cand0", "candidate", 120.0, accept=2.5, draft="d"),
        _arm("champion", "champion", 119.0, accept=2.5, draft="c"),
    ]
    (d,) = decide(arms, GATE)
    assert d.verdict == FAIL and d.gain_over_champion == pytest.approx(120 / 119)
    arms[2] = _arm("champion", "champion", 100.0, accept=2.0, draft="c")
    assert decide(arms, GATE)[0].passed


def test_best_config_of_a_draft_decides():
    arms = [
        _arm("baseline", "baseline", 90.0),
        _arm("cand0:s3", "candidate", 80.0, accept=2.0, draft="d"),
        _arm("cand0:s5", "candidate", 110.0, accept=2.6, draft="d"),
    ]
    (d,) = decide(arms, GATE)
    assert d.passed and d.best_arm == "cand0:s5"


def test_report_files_round_trip(tmp_path):
    arms = [
        _arm("baseline", "baseline", 90.0),
        _arm("cand0", "candidate", 100.0, accept=2.0, draft="d"),
    ]
    report = GateReport(
        fingerprint="fp",
        target="t",
        thresholds=GATE.model_dump(mode="json"),
        prompts={"chat": 4},
        arms=arms,
        decisions=decide(arms, GATE),
        passed=True,
        best={
            "arm": "cand0",
            "speculative": {"num_steps": 3},
            "launch_sglang": "python -m sglang.launch_server",
        },
    )
    paths = write_report(report, tmp_path)
    assert all(p.exists() and p.stat().st_size > 0 for p in paths.values())
    assert paths["throughput_png"].read_bytes()[:4] == b"\x89PNG"
    md = paths["markdown"].read_text()
    assert "# EAGLE-3 gate: PASS" in md and "python -m sglang.launch_server" in md
    assert read_report(tmp_path) == report
