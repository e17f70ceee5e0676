"""Where the trainer's features come from is decided once, by the capture stage's plan: stored
captures the ready shards; online plans no unit, writes nothing, and hands on the decision the vocab
and train stages plan with."""

from __future__ import annotations

from eagle3.capture.stage import CaptureStage, FeatureSource, features_dir_for
from eagle3.stage import run_stage


def test_online_capture_plans_no_unit_writes_nothing_and_returns_the_decision(
    make_config, two_regen_shards
):
    config = make_config("train.features=online")
    stage = CaptureStage()
    plan = stage.plan(config, regen_dir=two_regen_shards)
    assert (
        plan.units == () and plan.features.online and plan.features.why == "train.features=online"
    )

    source = FeatureSource.of(run_stage(stage, config, regen_dir=two_regen_shards))
    assert (
        source == plan.features
        and source.regen_dir == two_regen_shards
        and source.shards_dir is None
    )
    # the stage its batches stand for
    assert source.features_dir == features_dir_for(config, two_regen_shards)
    assert not (config.root_path / "features").exists()


def test_stored_capture_hands_on_the_captured_shards_and_the_reason(make_config, two_regen_shards):
    config = make_config("train.features=auto", "train.online.disk_budget_bytes=1000000000000")
    source = FeatureSource.of(run_stage(CaptureStage(), config, regen_dir=two_regen_shards))
    assert source.mode == "stored" and source.why.startswith("train.features=auto -> stored: ")
    assert source.shards_dir == str(features_dir_for(config, two_regen_shards))
    assert sorted(p.name for p in source.features_dir.glob("shard-*.parquet")) == [
        "shard-00003.parquet",
        "shard-00004.parquet",
    ]
