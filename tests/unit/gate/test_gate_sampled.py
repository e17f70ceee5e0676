"""The gate at the sampling users serve: each ``gate.sampling`` profile measured with its own
verdict and named in the report, sampled requests seeded so a gate reproduces its own tokens, a
speculative server that ignores sampling refused before a sampled profile (real SGLang on CPU, which
verifies greedily) while greedy still gates, and the rules that combine the profiles' verdicts."""

from __future__ import annotations

import pytest

from eagle3.config.pipeline import with_overrides
from eagle3.gate.profiles import combine
from eagle3.gate.release import GateRequest, run_gate
from eagle3.gate.report import FAIL, INCONCLUSIVE, PASS, Decision, LevelStats
from eagle3.gate.verdict import sampled_tokens
from eagle3.serve.launch_commands import build_launch

PROFILES = "gate.sampling={greedy: {}, sampled: {temperature: 1.0, top_p: 0.95}}"
QUICK = [
    "gate.prompts_per_set=2",
    "gate.max_new_tokens=16",
    "gate.min_rounds=2",
    "gate.max_rounds=2",
    # the physical checks measure the machine, not the profiles (test_gate_noise covers them)
    "gate.max_baseline_drift=1000",
    "gate.accept_bound_tolerance=1000",
]


def _quick(cfg):
    """One level only (an override merges into the world's {1: 1, 2: 0})."""
    return cfg.replace(gate=cfg.gate.replace(traffic={1: 1.0}))


@pytest.mark.slow
def test_a_greedy_and_a_sampled_profile_each_get_a_verdict_and_a_seeded_gate_reproduces_its_tokens(
    gate_world, tmp_path
):
    cfg = _quick(with_overrides(gate_world.config, [f"root={tmp_path / 'run'}", PROFILES, *QUICK]))
    logs = tmp_path / "logs"
    base = build_launch(cfg, "baseline", port=0).server(log_path=logs / "base.log")
    spec = build_launch(cfg, "eagle3", draft=gate_world.export, port=0).server(
        log_path=logs / "spec.log"
    )
    with base as b, spec as s:
        urls = {"baseline_url": b.url, "spec_url": s.url}
        request = GateRequest(drafts=[gate_world.export], promote=False, **urls)
        result = run_gate(cfg, request)
        markdown = (result.out_dir / "report.md").read_text()
        again = run_gate(cfg, request.model_copy(update={"force": True})).report
    first = result.report
    names = [a.name for a in first.arms]
    assert names == ["baseline", "cand0:s3-k1-n4", "baseline@sampled", "cand0:s3-k1-n4@sampled"]
    assert [a.sampling for a in first.arms] == ["greedy", "greedy", "sampled", "sampled"]
    assert all(a.error is None and sorted(a.rounds_at(1)) == [0, 1] for a in first.arms)
    (decision,) = first.decisions
    assert decision.sampling == "greedy" and [d.sampling for d in decision.profiles] == [
        "greedy",
        "sampled",
    ]
    rows = first.sampling_rows(decision)
    assert [(r["label"], r["decides"]) for r in rows] == [
        ("greedy", True),
        ("T=1 top_p=0.95", True),
    ]
    assert all(r["speedup"] and r["accept_length"] > 1 for r in rows), rows
    worst = min((d.verdict for d in decision.profiles), key=[FAIL, INCONCLUSIVE, PASS].index)
    assert decision.verdict == worst
    sampled = decision.profiles[1]
    assert any(c["name"] == "same_tokens" and "sampled" in c["message"] for c in sampled.checks)
    probe = [c for c in first.arms[3].preflight if c["name"] == "sampling"]
    assert probe and probe[0]["ok"] and "it samples" in probe[0]["message"], probe
    assert "greedy: greedy (decides" in markdown and "sampled: T=1 top_p=0.95 (decides" in markdown
    assert "verdict per sampling profile:" in markdown and "### Concurrency 1, sampled" in markdown
    # the same seeds give the same tokens: every round of every arm, greedy and sampled
    digests = [[r.output_digest for r in a.rounds] for a in first.arms]
    assert digests == [[r.output_digest for r in a.rounds] for a in again.arms]
    assert (
        len({d for a in digests[2:] for d in a}) == 4
    )  # sampled: new seeds each round, each arm its draws


@pytest.mark.sglang
@pytest.mark.slow
def test_a_sampled_gate_against_sglang_on_cpu_is_refused_by_the_probe_while_greedy_still_gates(
    gate_world, sglang_python, tmp_path
):
    sglang = ["server.engine=sglang", "server.device=cpu", "server.mem_fraction_static=0.05"]
    cfg = _quick(
        with_overrides(gate_world.config, [f"root={tmp_path / 'run'}", PROFILES, *QUICK, *sglang])
    )
    report = run_gate(cfg, GateRequest(drafts=[gate_world.export], promote=False)).report
    arms = {a.name: a for a in report.arms}
    refused = arms["cand0:s3-k1-n4@sampled"]
    assert "sampling preflight failed" in refused.error and "ignores sampling" in refused.error
    assert "SGLang 0.5.23 does on CPU" in refused.error and not refused.rounds
    assert not arms[
        "baseline@sampled"
    ].rounds  # nothing to compare: the sampled rounds are not measured
    (decision,) = report.decisions
    greedy, sampled = decision.profiles
    assert greedy.rounds == 2 and greedy.speedup is not None and greedy.accept_length > 1
    assert sampled.verdict == FAIL and any("ignores sampling" in r for r in sampled.reasons)
    assert decision.verdict == FAIL
    assert any(
        r.startswith("at sampled (T=1 top_p=0.95):") and "ignores sampling" in r
        for r in decision.reasons
    )


def _decision(verdict: str, reasons: list[str] | None = None) -> Decision:
    return Decision("d", verdict == PASS, "cand0", 1.2, 2.5, None, reasons or [], verdict=verdict)


@pytest.mark.parametrize(
    ("greedy", "sampled", "decides", "expected"),
    [
        (PASS, PASS, True, PASS),
        (PASS, INCONCLUSIVE, True, INCONCLUSIVE),
        (INCONCLUSIVE, FAIL, True, FAIL),
        (PASS, FAIL, False, PASS),
    ],
)
def test_the_draft_passes_only_when_every_deciding_profile_passes(
    greedy, sampled, decides, expected
):
    profiles = f"gate.sampling={{g: {{}}, s: {{temperature: 1, decides: {decides}}}}}"
    cfg = with_overrides(llama_config(), [profiles])
    per = {"g": [_decision(greedy)], "s": [_decision(sampled, [] if sampled == PASS else ["slow"])]}
    (combined,) = combine(per, cfg.gate)
    assert combined.verdict == expected and combined.passed == (expected == PASS)
    assert combined.sampling == "g" and [d.sampling for d in combined.profiles] == ["g", "s"]
    if sampled != PASS and decides:
        assert "at s (T=1): slow" in combined.reasons
    if sampled != PASS and not decides:
        assert any(w.startswith("at s (T=1, reported only): FAIL") for w in combined.warnings)


def llama_config():
    from eagle3.recipes import load_recipe

    return load_recipe("llama3_8b")


def _round(tokens: list[int], r: int) -> LevelStats:
    stats = LevelStats(1, len(tokens), sum(tokens), 0, 1.0, float(sum(tokens)), 1.0, None, round=r)
    stats.completion_lengths = tokens
    return stats


def test_sampled_token_counts_are_compared_as_draws_not_as_equal_work():
    gate = llama_config().gate
    # the baseline's sampled lengths of 6 prompts over 3 rounds; the prompts differ far more than
    # each prompt's answers do, and only the latter is sampling noise
    base = {r: _round([8 + r, 40 - r, 16, 64 + 2 * r, 24, 12 - r], r) for r in range(3)}
    drawn = {r: _round([10 - r, 38 + r, 17, 66 - r, 23, 11], r) for r in range(3)}
    ok, message = sampled_tokens(drawn, base, "cand", gate)
    assert ok and "sampled" in message
    shorter = {r: _round([6, 32, 12, 52, 19, 9], r) for r in range(3)}  # 20% fewer tokens each
    assert not sampled_tokens(shorter, base, "cand", gate)[0]
    assert sampled_tokens(
        shorter, base, "cand", gate.model_copy(update={"max_token_mismatch": 0.3})
    )[0]
