"""The regen stage through the generic tasks (``task.fn``): plan, shard, finalize; the cache key
ignores servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.config.pipeline import PipelineConfig
from eagle3.config.regen import RegenConfig
from eagle3.config.target import TargetConfig
from eagle3.regen.plan import RegenPlan
from eagle3.regen.stage import RegenStage, server_limit_names
from eagle3.rundir.layout import shard_name
from eagle3.serve.launch import reference_server
from eagle3.stage import UnitsFailed
from tasks.stage import finalize_task, plan_task, unit_cache_key, unit_task


def test_shard_task_cache_key_ignores_servers_and_is_none_until_the_shard_exists(tmp_path):
    plan = RegenPlan(
        stage="regen",
        fingerprint="f",
        out_dir=tmp_path,
        units=(3,),
        prompts_dir=tmp_path,
        prompts_fingerprint="p",
        shards={3: 1},
    )
    params = {"stage": RegenStage(), "plan": plan, "unit": 3}
    assert unit_cache_key(None, {**params, "env": ["http://a"]}) is None
    (tmp_path / shard_name(3)).write_bytes(b"rows")
    a = unit_cache_key(None, {**params, "env": ["http://a"]})
    b = unit_cache_key(None, {**params, "env": ["http://b"]})
    assert a is not None and a == b
    assert (
        unit_cache_key(None, {**params, "plan": plan.model_copy(update={"fingerprint": "g"})}) != a
    )
    (tmp_path / shard_name(3)).write_bytes(b"rebuilt rows")
    assert unit_cache_key(None, params) != a
    assert server_limit_names(["http://10.0.0.1:30000"]) == ["regen-server-10-0-0-1-30000"]


def test_plan_shard_finalize_tasks(prefect_harness, tmp_path, write_prompts_stage):
    from eagle3.worlds.tiny_target import build_model, build_tokenizer

    model_dir = tmp_path / "model"
    tokenizer = build_tokenizer([f"q {i} text" for i in range(200)], vocab_size=300)
    build_model(tokenizer, num_layers=4, max_position_embeddings=128).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    questions = [
        {
            "sample_id": f"{s}-{i}",
            "source": "t",
            "messages": [{"role": "user", "content": f"q {s} {i}"}],
        }
        for s in range(2)
        for i in range(3)
    ]
    prompts = write_prompts_stage(tmp_path, [questions[:3], questions[3:]])
    with reference_server(None, extra_args=["--synthetic-tokens", "2"]) as server:
        config = PipelineConfig(
            name="t",
            root=str(tmp_path),
            target=TargetConfig(
                model_path=str(model_dir), num_layers=8, hidden_size=128, vocab_size=300
            ),
            regen=RegenConfig(servers=[server.url], max_new_tokens=2),
        )
        stage = RegenStage()
        plan = plan_task.fn(stage, config, {"prompts_dir": str(prompts), "shard_ids": [1]})
        assert plan.units == (1,)
        report = unit_task.fn(stage, config, plan, 1, [server.url])
    assert not report.skipped and report.rows == 3
    result = finalize_task.fn(stage, config, plan, [report], [])
    assert result.summary["shards_pending"] == [0] and not result.done
    assert json.loads((plan.out_dir / "failed_shards.json").read_text()) == []
    with pytest.raises(
        UnitsFailed,
        match=r"regen failed for units \[0\].*eagle3 retry-shards --run .* --shard 0\.$",
    ):
        # the failure policy: recorded, no manifest, retrigger
        finalize_task.fn(stage, config, plan, [report], [0])
    assert json.loads((plan.out_dir / "failed_shards.json").read_text()) == [0]
    assert not (plan.out_dir / "manifest.json").exists()


def test_health_reads_the_pool_the_shards_share(tmp_path: Path):
    """The flow's monitor asks ``RegenStage.health`` for per-server state: the same pool object the
    shards use (``shared_pool`` keyed by the servers and the regen pool settings), with every server
    healthy before any work."""
    from eagle3.regen.pool import shared_pool

    config = PipelineConfig(
        name="t",
        root=str(tmp_path),
        regen=RegenConfig(servers=["http://127.0.0.1:9"]),
        target=TargetConfig(
            model_path=str(tmp_path), num_layers=8, hidden_size=128, vocab_size=300
        ),
    )
    health = RegenStage().health(config, ["http://127.0.0.1:9/"])
    assert health == [{"url": "http://127.0.0.1:9", "healthy": True, "completed": 0, "errors": 0}]
    assert shared_pool(["http://127.0.0.1:9"], config.regen) is shared_pool(
        ["http://127.0.0.1:9/"], config.regen
    )
