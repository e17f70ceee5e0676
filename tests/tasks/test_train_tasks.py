"""The train and export stages through the generic stage tasks (``task.fn``): plan, train through
the real worker subprocess (``python -m eagle3.train`` on Parquet features), resume-on-rerun, export
with the capture manifest's layer ids, and the unit cache keys."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from prefect.logging import disable_run_logger

from eagle3.capture.manifest import finalize_features
from eagle3.capture.shard import capture_shard
from eagle3.capture.stage import FeatureSource
from eagle3.config.pipeline import with_overrides
from eagle3.model.export_format import validate_export
from eagle3.stage import Progress
from eagle3.train.stage import ExportPlan, ExportStage, TrainPlan, TrainStage
from eagle3.train.vocab import build_vocab_stage
from tasks.stage import finalize_task, plan_task, unit_cache_key, unit_task

TRAIN_OVERRIDES = [
    "vocab.draft_vocab_size=64",
    "train.max_steps=4",
    "train.ttt_steps=2",
    "train.batch_size=2",
    "train.save_every=2",
    "train.log_every=1",
    "train.max_seq_len=256",
]


def train_stage_inputs(config, write_regen_stage) -> tuple[str, str]:
    """A finished features stage (8 rendered conversations, 1 shard) and its vocab file, built with
    the library."""
    regen = write_regen_stage(config.root_path / "regen" / "regenfp", shards=1, rows=8, seed=5)
    features = config.root_path / "features" / "featfp"
    result = capture_shard(config, regen / "shard-00000.parquet", features)
    finalize_features(config, features, [result["shard_index"]])
    return str(features), str(build_vocab_stage(config, FeatureSource.stored(features)))


@pytest.fixture
def train_setup(tiny_config, write_regen_stage, tmp_path):
    config = with_overrides(tiny_config, [f"root={tmp_path / 'root'}", *TRAIN_OVERRIDES])
    features, vocab = train_stage_inputs(config, write_regen_stage)
    return config, features, vocab


def _worker_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "eagle3.train.stage"]


@pytest.mark.slow
def test_train_runs_the_worker_resumes_on_rerun_and_export_writes_a_valid_draft(
    train_setup, prefect_harness, caplog
):
    config, features, vocab = train_setup
    train = TrainStage()
    caplog.set_level(logging.INFO, logger="eagle3")
    with disable_run_logger():
        plan = plan_task.fn(train, config, {"features": features, "vocab": str(Path(vocab).parent)})
        assert (
            plan.train_samples == 8
            and plan.out_dir.name == plan.fingerprint
            and plan.vocab == Path(vocab)
        )
        assert train.progress(plan) == Progress(done=0, total=4, unit="steps")
        first = unit_task.fn(train, config, plan, 0)
        ckpt = plan.out_dir / "ckpt"
        assert not first.skipped and (ckpt / "latest").read_text().strip() == "step-000004"
        # worker lines reach the library logger
        assert any("step 4/4" in line for line in _worker_lines(caplog))
        assert train.progress(plan).done == 4

        (ckpt / "latest").write_text("step-000002")  # as if killed after the step-2 checkpoint
        caplog.clear()
        resumed = unit_task.fn(train, config, plan, 0)
        assert not resumed.skipped and any("resumed from" in line for line in _worker_lines(caplog))
        assert (ckpt / "latest").read_text().strip() == "step-000004"
        assert unit_task.fn(train, config, plan, 0).skipped  # finished: no worker is started again
        result = finalize_task.fn(train, config, plan, [resumed], [])
        assert result.done and result.summary["steps"] == 4 and "loss" in result.summary["final"]

        export = ExportStage()
        export_plan = plan_task.fn(
            export,
            config,
            {"draft_dir": plan.out_dir, "vocab": str(plan.vocab), "features": features},
        )
        report = unit_task.fn(export, config, export_plan, 0)
        exported = finalize_task.fn(export, config, export_plan, [report], [])
    path = Path(exported.summary["export"])
    assert path == plan.out_dir / "export" and validate_export(path) == []
    # the model card is the export summary artifact
    assert exported.markdown == (path / "README.md").read_text()
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]


def test_train_and_export_cache_keys_exist_only_while_their_outputs_do(tmp_path):
    def plans(root: Path) -> tuple[TrainPlan, ExportPlan]:
        out, features, vocab = root / "drafts" / "fp", root / "features" / "f", root / "vocab" / "v"
        source = FeatureSource.stored(features)
        return (
            TrainPlan(
                stage="train",
                fingerprint="fp",
                out_dir=out,
                features=source,
                vocab=vocab,
                train_samples=8,
                planned_steps=4,
            ),
            ExportPlan(
                stage="export",
                fingerprint="fp",
                out_dir=out,
                features=source,
                vocab=vocab,
                settings="s",
            ),
        )

    def keys(root: Path) -> list[str | None]:
        train, export = plans(root)
        return [
            unit_cache_key(None, {"stage": TrainStage(), "plan": train, "unit": 0}),
            unit_cache_key(None, {"stage": ExportStage(), "plan": export, "unit": 0}),
        ]

    old = tmp_path / "old"
    assert keys(old) == [None, None]
    latest, export = old / "drafts" / "fp" / "ckpt" / "latest", old / "drafts" / "fp" / "export"
    latest.parent.mkdir(parents=True)
    latest.write_text("step-000004")
    export.mkdir()
    (export / "model.safetensors").write_bytes(b"weights")
    train_key, export_key = keys(old)
    assert train_key.startswith("train-fp-0-") and export_key.startswith("export-fp-0-")
    # Same fingerprint under another run root (a deleted one, say): never served the old root's
    # result.
    assert keys(tmp_path / "new") == [None, None]
