"""Capture tasks called as plain functions (``task.fn``): plan, shard, finalize, vocab, and the cache key."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.logging import disable_run_logger

from eagle3.runroot import Manifest


@pytest.fixture
def capture_setup(tiny_config, write_regen_stage, tmp_path):
    from eagle3.config import with_overrides

    config = with_overrides(tiny_config, [f"root={tmp_path / 'root'}", "vocab.draft_vocab_size=64"])
    regen = write_regen_stage(config.root_path / "regen" / "regenfp")
    return config, regen


def test_capture_tasks_plan_capture_finalize_and_build_vocab(capture_setup, prefect_harness):
    from tasks.capture import capture_shard_task, finalize_features_task, plan_capture_task, vocab_task

    config, regen = capture_setup
    with disable_run_logger():
        plan = plan_capture_task.fn(config, str(regen), None)
        assert sorted(plan["shards"]) == [0, 1] and plan["missing"] == []
        results = [capture_shard_task.fn(config, path, plan["features_dir"], plan["fingerprint"], i)
                   for i, path in sorted(plan["shards"].items())]
        features = finalize_features_task.fn(config, plan, results, [])
        vocab = vocab_task.fn(config, features)
    assert [r["rows"] + r["quarantined"] for r in results] == [5, 5]
    manifest = Manifest.read(Path(features))
    assert manifest is not None and manifest.stats["rows"] + manifest.stats["quarantined"] == 10
    assert manifest.verify(Path(features)) == []
    assert Path(vocab).name == "vocab.safetensors" and Path(vocab).exists()


def test_plan_reports_regen_shards_not_ready(capture_setup):
    from tasks.capture import plan_capture_task

    config, regen = capture_setup
    with disable_run_logger():
        plan = plan_capture_task.fn(config, str(regen), [0, 1, 7])
    assert sorted(plan["shards"]) == [0, 1] and plan["missing"] == [7]


def test_a_failed_shard_is_recorded_and_fails_the_stage_with_the_retrigger_command(capture_setup, prefect_harness):
    from eagle3.layout import ShardsFailed, read_failed_shards
    from tasks.capture import capture_shard_task, finalize_features_task, plan_capture_task

    config, regen = capture_setup
    with disable_run_logger():
        plan = plan_capture_task.fn(config, str(regen), None)
        done = [capture_shard_task.fn(config, plan["shards"][0], plan["features_dir"], plan["fingerprint"], 0)]
        retrigger = r"capture failed for shards \[1\].*eagle3 capture --regen-dir .* --shard 1"
        with pytest.raises(ShardsFailed, match=retrigger):
            finalize_features_task.fn(config, plan, done, [1])
    features = Path(plan["features_dir"])
    assert read_failed_shards(features) == [1]
    assert Manifest.read(features) is None and (features / "shard-00000.parquet").exists()


def test_shard_cache_key_changes_when_the_output_is_cut(tmp_path):
    from tasks.capture import _shard_cache_key

    out = tmp_path / "features" / "fp"
    params = {"fingerprint": "fp", "shard_index": 0, "features_dir": str(out)}
    assert _shard_cache_key(None, params) is None  # nothing on disk: never served from the cache
    out.mkdir(parents=True)
    (out / "shard-00000.parquet").write_bytes(b"x" * 100)
    whole = _shard_cache_key(None, params)
    (out / "shard-00000.parquet").write_bytes(b"x" * 60)
    assert whole.startswith("task-fp-0") and _shard_cache_key(None, params) != whole
