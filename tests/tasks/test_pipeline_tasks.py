"""The night's summary task (``tasks.pipeline``): what a person reads on the nightly run's page."""

from __future__ import annotations

import pytest

from eagle3.capture.costs import choose_features
from eagle3.config.pipeline import with_overrides
from eagle3.gate.stage import GateOutcome
from eagle3.recipes import load_recipe
from eagle3.scaling.night import Night
from eagle3.scaling.stage import Curve, NightSummary
from eagle3.stage import StageResult
from eagle3.train.stage import TrainedDraft


# task.fn: no run
@pytest.mark.filterwarnings("ignore:Artifact creation outside of a flow:FutureWarning")
def test_the_night_summary_says_how_train_features_was_decided(prefect_harness):
    from tasks.pipeline import publish_summary_task

    config = with_overrides(
        load_recipe("kimi_k2_5"), ["train.features=auto", "train.online.disk_budget_bytes=1"]
    )
    decision = choose_features(config)  # before regen: estimated
    summary = NightSummary(
        night=Night(
            policy="uniform",
            prompts_dir="/runs/prompts/fp",
            total_prompts=88088,
            shard_ids=[0, 1],
            new_shard_ids=[1],
            pool_prompts=88088,
            exhausted=False,
            plan_markdown="",
        ),
        regen=StageResult(stage="regen", fingerprint="fp", out_dir="/runs/regen/fp", done=True),
        draft=TrainedDraft(
            fingerprint="fp",
            out_dir="/runs/drafts/fp",
            vocab="/v",
            train_samples=1,
            export="/runs/drafts/fp/export",
        ),
        gate=GateOutcome(
            out_dir="/g",
            report="/r.json",
            markdown="/r.md",
            passed=True,
            verdict="pass",
            reasons=[],
        ),
        curve=Curve(points=2, verdict="still data-limited", png="/c.png", curve="/c.jsonl"),
        features_mode=decision.why,
    )
    markdown = publish_summary_task.fn(summary)
    assert f"- features: {decision.why}" in markdown
    assert "auto -> online" in markdown and "estimated: mix.total x 1500 tokens/sample" in markdown
    # a summary from before the decision was recorded
    before = summary.model_copy(update={"features_mode": None})
    assert "- features: train.features=stored" in publish_summary_task.fn(before)


# task.fn: no run
@pytest.mark.filterwarnings("ignore:Artifact creation outside of a flow:FutureWarning")
def test_the_night_summary_counts_rows_by_where_their_answers_came_from(prefect_harness):
    from tasks.pipeline import publish_summary_task

    summary = NightSummary(
        night=Night(
            policy="uniform",
            prompts_dir="/p",
            total_prompts=12,
            shard_ids=[0],
            new_shard_ids=[0],
            pool_prompts=12,
            exhausted=False,
            plan_markdown="",
        ),
        regen=StageResult(
            stage="regen",
            fingerprint="fp",
            out_dir="/r",
            done=True,
            summary={"ok": 10, "truncated": 1, "served": 6, "pretokenized": 2},
        ),
        draft=TrainedDraft(
            fingerprint="fp", out_dir="/d", vocab="/v", train_samples=11, export="/d/export"
        ),
        gate=GateOutcome(
            out_dir="/g",
            report="/r.json",
            markdown="/r.md",
            passed=True,
            verdict="pass",
            reasons=[],
        ),
        curve=Curve(points=1, verdict="one point", png="/c.png", curve="/c.jsonl"),
    )
    assert summary.row_sources() == {"served": 6, "regenerated": 3, "pretokenized": 2}
    assert "- rows: 6 served, 3 regenerated, 2 pretokenized" in publish_summary_task.fn(summary)


@pytest.mark.filterwarnings("ignore:Artifact creation outside of a flow:FutureWarning")
def test_the_night_summary_names_the_target_model_and_its_data(prefect_harness):
    from tasks.pipeline import publish_summary_task

    night = Night(
        policy="uniform",
        prompts_dir="/p",
        total_prompts=8,
        shard_ids=[0],
        new_shard_ids=[0],
        pool_prompts=8,
        exhausted=True,
        plan_markdown="",
    )
    gate = GateOutcome(
        out_dir="/g", report="/r.json", markdown="/r.md", passed=False, verdict="fail", reasons=[]
    )
    draft = TrainedDraft(
        fingerprint="fp", out_dir="/d", vocab="/v", train_samples=8, export="/d/export"
    )
    summary = NightSummary(
        night=night,
        regen=StageResult(stage="regen", fingerprint="fp", out_dir="/runs/regen/fp", done=True),
        draft=draft,
        gate=gate,
        curve=Curve(points=1, verdict="one point", png="/c.png", curve="/c.jsonl"),
        target="/cache/smollm2-world-0123/SmolLM2-135M-Instruct",
        sources=("sharegpt",),
    )
    markdown = publish_summary_task.fn(summary)
    assert "- target: `SmolLM2-135M-Instruct` (/cache/smollm2-world-0123/SmolLM2-" in markdown
    assert "data: sharegpt" in markdown
