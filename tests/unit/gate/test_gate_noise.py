"""The gate against a noisy baseline server (the reference server's ``--fault-slow-*`` flags): a
draft below the threshold whose baseline was slowed for part of the measurement is not promoted, and
the report names the check that caught the noise."""

from __future__ import annotations

from dataclasses import replace

import pytest

from eagle3.config.pipeline import with_overrides
from eagle3.gate.release import GateRequest, run_gate
from eagle3.gate.report import INCONCLUSIVE
from eagle3.registry import Registry
from eagle3.serve.launch_commands import build_launch
from eagle3.serve.reference.faults import slow_schedule

pytestmark = pytest.mark.slow

SEED, PER_SET, WARMUP = 0, 2, 1


def test_a_baseline_slowed_in_one_round_makes_a_slow_draft_inconclusive_not_promoted(
    gate_world, tmp_path
):
    cfg = with_overrides(
        gate_world.config,
        [
            f"root={tmp_path / 'run'}",
            "gate.traffic={1: 1}",
            f"gate.prompts_per_set={PER_SET}",
            f"gate.warmup_requests={WARMUP}",
            "gate.max_new_tokens=16",
            "gate.min_rounds=2",
            "gate.max_rounds=3",
            "gate.min_speedup=1.5",  # above what the tiny draft really reaches: it must not pass
        ],
    )
    # generation requests the baseline gets per round: one block each
    per_round = WARMUP + 3 * PER_SET
    assert slow_schedule(SEED, 0.5, 2) == [False, True]  # round 0 clean, round 1 slowed
    noise = [
        "--fault-slow-s",
        "1.5",
        "--fault-slow-fraction",
        "0.5",
        "--fault-slow-block",
        str(per_round),
        "--fault-seed",
        str(SEED),
    ]
    baseline = build_launch(cfg, "baseline", engine="reference", port=0)
    noisy = replace(baseline, argv=[*baseline.argv, *noise])
    spec = build_launch(cfg, "eagle3", engine="reference", draft=gate_world.export, port=0)
    with (
        noisy.server(log_path=tmp_path / "baseline.log", health_timeout_s=120) as base_srv,
        spec.server(log_path=tmp_path / "spec.log", health_timeout_s=120) as spec_srv,
    ):
        urls = {"baseline_url": base_srv.url, "spec_url": spec_srv.url}
        request = GateRequest(drafts=[gate_world.export], **urls)
        result = run_gate(cfg, request)
    (decision,) = result.report.decisions
    assert decision.verdict == INCONCLUSIVE and result.report.verdict == INCONCLUSIVE, (
        decision.reasons
    )
    assert decision.rounds == 2  # a failed sanity check settles it: no further round is measured
    failed = {c["name"] for c in decision.checks if not c["ok"]}
    assert {"accept_bound", "baseline_drift"} <= failed, decision.checks
    assert result.report.promotion is None and Registry(cfg.root_path).champion() is None
    assert "# EAGLE-3 gate: INCONCLUSIVE" in (result.out_dir / "report.md").read_text()
