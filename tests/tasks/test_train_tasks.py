"""Train-stage tasks called as plain functions (``task.fn``): plan, train through the real worker subprocess
(``python -m eagle3.train`` on Parquet features), resume-on-rerun, export with the capture manifest's layer ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prefect.logging import disable_run_logger

from eagle3.capture.run import capture_shard, finalize_features
from eagle3.config import with_overrides
from eagle3.model.export_format import validate_export
from eagle3.train.vocab import build_vocab_stage

TRAIN_OVERRIDES = ["vocab.draft_vocab_size=64", "train.max_steps=4", "train.ttt_steps=2", "train.batch_size=2",
                   "train.save_every=2", "train.log_every=1", "train.max_seq_len=256"]


def train_stage_inputs(config, write_regen_stage) -> tuple[str, str]:
    """A finished features stage (8 rendered conversations, 1 shard) and its vocab file, built with the library."""
    regen = write_regen_stage(config.root_path / "regen" / "regenfp", shards=1, rows=8, seed=5)
    features = config.root_path / "features" / "featfp"
    result = capture_shard(config, regen / "shard-00000.parquet", features)
    finalize_features(config, features, [result["shard_index"]])
    return str(features), str(build_vocab_stage(config, features))


@pytest.fixture
def train_setup(tiny_config, write_regen_stage, tmp_path):
    config = with_overrides(tiny_config, [f"root={tmp_path / 'root'}", *TRAIN_OVERRIDES])
    features, vocab = train_stage_inputs(config, write_regen_stage)
    return config, features, vocab


@pytest.mark.slow
def test_train_task_runs_the_worker_and_export_task_writes_a_valid_draft(train_setup, prefect_harness):
    from tasks.train import export_draft_task, plan_draft_task, train_draft_task

    config, features, vocab = train_setup
    with disable_run_logger():
        plan = plan_draft_task.fn(config, features, vocab)
        assert plan["train_samples"] == 8 and Path(plan["out_dir"]).name == plan["fingerprint"]
        result = train_draft_task.fn(config, features, plan["vocab"], plan["out_dir"], plan["fingerprint"])
        assert result["steps"] == 4
        ckpt = Path(plan["out_dir"]) / "ckpt"
        assert (ckpt / "latest").read_text().strip() == "step-000004"
        rerun = train_draft_task.fn(config, features, plan["vocab"], plan["out_dir"], plan["fingerprint"])
        assert rerun["steps"] == 4  # resumed from latest: nothing left to train
        export = Path(export_draft_task.fn(config, plan["out_dir"], plan["vocab"], features, plan["fingerprint"]))
    assert validate_export(export) == []
    cfg = json.loads((export / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]


def test_train_and_export_cache_keys_exist_only_while_their_outputs_do(tmp_path):
    from tasks.train import _export_cache_key, _train_cache_key

    old_root = {"fingerprint": "fp", "out_dir": str(tmp_path / "old" / "drafts" / "fp")}
    new_root = {"fingerprint": "fp", "out_dir": str(tmp_path / "new" / "drafts" / "fp")}
    latest, weights = Path(old_root["out_dir"]) / "ckpt" / "latest", Path(old_root["out_dir"]) / "export"
    assert _train_cache_key(None, old_root) is None and _export_cache_key(None, old_root) is None
    latest.parent.mkdir(parents=True)
    latest.write_text("step-000004")
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"weights")
    assert _train_cache_key(None, old_root) is not None and _export_cache_key(None, old_root) is not None
    # Same fingerprint under another run root (a deleted one, say): never served the old root's result.
    assert _train_cache_key(None, new_root) is None and _export_cache_key(None, new_root) is None
