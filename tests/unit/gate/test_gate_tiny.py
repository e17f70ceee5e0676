"""The gate end to end on the tiny world: reference server arms, a trained draft, real
measurements."""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from eagle3.config.pipeline import with_overrides
from eagle3.gate import preflight, preflight_runtime
from eagle3.gate.prompts import load_gate_prompts
from eagle3.gate.release import GateRequest, run_gate
from eagle3.gate.report import FAIL, PASS
from eagle3.gate.rounds import flush_cache
from eagle3.gate.verdict import decide
from eagle3.registry import Registry, draft_id
from eagle3.serve.launch import reference_server
from eagle3.serve.launch_commands import build_launch

pytestmark = pytest.mark.slow


def _smoke_prompts(world) -> list[list[int]]:
    prompts = load_gate_prompts(world.config.gate.prompt_sets, world.tokenizer, per_set=2)
    return [list(p.input_ids) for p in prompts[:4]]


def _runtime(world, algorithm: str, tmp_path: Path) -> dict[str, preflight.Check]:
    cfg = with_overrides(world.config, [f"speculative.algorithm={algorithm}"])
    cmd = build_launch(cfg, "eagle3", engine="reference", draft=world.export, port=0)
    with cmd.server(log_path=tmp_path / f"{algorithm}.log", health_timeout_s=120) as server:
        checks = preflight_runtime.run_runtime(
            server.url, _smoke_prompts(world), export_dir=world.export, max_new_tokens=32
        )
    return {c.name: c for c in checks}


def test_eagle_instead_of_eagle3_serves_accept_length_one_and_fails_runtime_preflight(
    gate_world, tmp_path
):
    good = _runtime(gate_world, "EAGLE3", tmp_path)
    assert all(c.ok for c in good.values()), [c.line() for c in good.values()]
    bad = _runtime(gate_world, "EAGLE", tmp_path)
    assert not bad["server_algorithm"].ok and "'EAGLE'" in bad["server_algorithm"].message
    assert not bad["smoke_accept"].ok
    accept, served = (float(checks["smoke_accept"].message.split()[2]) for checks in (bad, good))
    # blind, the draft adds under half its tokens per pass
    assert served - 1 > 2 * (accept - 1), (served, accept)


def test_gate_flush_retries_while_the_server_is_busy_then_says_why_it_could_not():
    """SGLang answers ``/flush_cache`` with 400 while requests run; the gate retries, then reports
    the refusal."""
    with reference_server(
        None, extra_args=["--synthetic-tokens", "2", "--synthetic-delay", "3"]
    ) as srv:
        assert flush_cache(srv.url) is None  # idle
        busy = threading.Thread(
            target=urllib.request.urlopen, args=(srv.url + "/generate", b'{"input_ids": [5]}', 30)
        )
        busy.start()
        time.sleep(0.5)
        failure = flush_cache(srv.url, attempts=2, wait_s=0.1)
        busy.join()
        assert flush_cache(srv.url, attempts=3, wait_s=0.2) is None
    assert failure is not None and "after 2 attempts" in failure and "HTTP 400" in failure


def test_gate_passes_promotes_and_reports_then_reuses_the_report_for_its_champion(gate_world):
    cfg = gate_world.config
    gate = cfg.gate
    result = run_gate(cfg, GateRequest(drafts=[gate_world.export]))
    report = result.report
    assert report.passed and report.verdict == PASS, [d.reasons for d in report.decisions]
    names = [a.name for a in report.arms]
    assert names == ["baseline", "cand0:s3-k1-n4"]
    for arm in report.arms:
        assert arm.error is None and [lv.concurrency for lv in arm.levels] == [1, 2]
        assert arm.flush_failures == []  # the cache was flushed before every round
        # a PASS takes every round, and every round measures every level of the profile (2: weight
        # 0)
        assert sorted(arm.rounds_at(1)) == sorted(arm.rounds_at(2)) == list(range(gate.max_rounds))
        assert all(
            r.requests == 12 and r.completion_tokens > 0 and r.output_tok_s > 0 for r in arm.rounds
        )
        assert arm.level(1).requests == 12 * gate.max_rounds  # pooled
    (decision,) = report.decisions
    lo, hi = decision.speedup_interval
    assert decision.rounds == gate.max_rounds and gate.min_speedup <= lo <= decision.speedup <= hi
    assert {c["name"] for c in decision.checks} == {"accept_bound", "baseline_drift", "same_tokens"}
    # 2 weighs nothing
    assert all(c["ok"] and c["concurrency"] == 1 for c in decision.checks), decision.checks
    assert [(lv.concurrency, lv.share, lv.rounds) for lv in decision.levels] == [
        (1, 1.0, 3),
        (2, 0.0, 3),
    ]
    assert decision.crossover is not None and decision.crossover["summary"]
    assert set(decision.by_set) == {"chat", "code", "math"}
    assert all(
        row["prompts"] == 4
        and row["requests"] == 4 * 2 * gate.max_rounds
        and row["accept_length"] > 1
        for row in decision.by_set.values()
    ), decision.by_set
    assert report.cost == {
        **report.cost,
        "rounds": gate.max_rounds,
        "levels": 2,
        "arms": 2,
        "batches": 2 * 2 * gate.max_rounds,
    }
    adaptive = report.adaptive
    assert [t["batch_size"] for t in adaptive["tiers"]] == [1, 2]
    assert Path(adaptive["draft"]) == gate_world.export.resolve()
    # some tier drafts: its JSON beside the report, in the manifest
    if adaptive["config"] is not None:
        assert (
            json.loads((result.out_dir / "adaptive_config.json").read_text()) == adaptive["config"]
        )
        assert "--speculative-adaptive --speculative-adaptive-config" in adaptive["launch_sglang"]
    markdown = (result.out_dir / "report.md").read_text()
    assert (
        "# EAGLE-3 gate: PASS" in markdown
        and "## Rounds" in markdown
        and f"interval {lo:.3f}..{hi:.3f}" in markdown
    )
    assert (
        "## Serving configuration (SGLang adaptive speculation)" in markdown
        and "crossover: " in markdown
    )
    assert "## Accept length per prompt set" in markdown and "| 2 | 0% | 3 |" in markdown
    cand = report.arms[1]
    assert cand.level(1).accept_length >= cfg.gate.min_accept
    assert {c["name"] for c in cand.preflight} >= {
        "server_algorithm",
        "server_draft",
        "smoke_accept",
    }
    assert "--speculative-algorithm EAGLE3" in report.best["launch_sglang"]
    assert report.best["launch_sglang"].startswith("python -m sglang.launch_server")
    assert "eagle3.serve.reference" in report.best["launch_used"]
    for name in (
        "report.json",
        "report.md",
        "throughput.png",
        "accept_length.png",
        "manifest.json",
    ):
        assert (result.out_dir / name).exists()
    champion = Registry(cfg.root_path).champion()
    assert champion is not None and champion.draft_id == draft_id(gate_world.export)
    assert report.promotion["draft_id"] == champion.draft_id
    assert json.loads((result.out_dir / "report.json").read_text())["passed"] is True
    # the next night, same draft: now the champion
    again = run_gate(cfg, GateRequest(drafts=[gate_world.export]))
    assert again.reused and again.out_dir == result.out_dir

    # The same real measurements against thresholds they cannot meet: refused, with the reason.
    (slow,) = decide(report.arms, gate.model_copy(update={"min_speedup": 1000.0}))
    assert slow.verdict == FAIL and any("below min_speedup 1000.0" in r for r in slow.reasons)
    (weak,) = decide(report.arms, gate.model_copy(update={"min_accept": 50.0}))
    assert weak.verdict == FAIL and any("min_accept 50.0" in r for r in weak.reasons)


def test_challenger_must_beat_the_champion_to_be_promoted(gate_world, tmp_path):
    cfg = with_overrides(
        gate_world.config,
        [
            f"root={tmp_path / 'run'}",
            "gate.traffic={1: 1}",
            "gate.prompts_per_set=2",
            "gate.max_new_tokens=16",
            "gate.min_gain_over_champion=1000",
            # the physical checks measure the machine, not the champion rule: on a loaded machine
            # the baseline's rounds drift past 20% and the verdict would be INCONCLUSIVE
            # (test_gate_noise covers the checks)
            "gate.max_baseline_drift=1000",
            "gate.accept_bound_tolerance=1000",
        ],
    )
    registry = Registry(cfg.root_path)
    champion = registry.promote(gate_world.export, report="seed")
    challenger = tmp_path / "challenger"
    shutil.copytree(gate_world.export, challenger)
    config_json = json.loads((challenger / "config.json").read_text())
    config_json["max_position_embeddings"] += 1  # same weights, another draft id
    (challenger / "config.json").write_text(json.dumps(config_json))

    result = run_gate(cfg, GateRequest(drafts=[challenger]))
    roles = [a.role for a in result.report.arms]
    assert roles == ["baseline", "candidate", "champion"]
    assert all(a.error is None and a.levels for a in result.report.arms)
    (decision,) = result.report.decisions
    assert (
        decision.verdict == FAIL
        and decision.gain_over_champion is not None
        and decision.gain_interval
    )
    assert any("below min_gain_over_champion" in r for r in decision.reasons), decision.reasons
    assert decision.rounds == cfg.gate.min_rounds  # a FAIL may stop as soon as min_rounds allow
    assert result.report.promotion is None
    assert registry.champion().draft_id == champion.draft_id
