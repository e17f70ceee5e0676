"""The capture flow captures every ready regen shard, writes the manifest, skips finished shards on
a re-run, and the vocab flow builds the draft vocab from it; ``eagle3 capture`` runs the same
flow."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from eagle3.rundir.runroot import Manifest
from eagle3.stage import Progress


def test_capture_flow_then_vocab_flow(tiny_config, write_regen_stage, tmp_path, prefect_harness):
    from eagle3.capture.stage import capture_progress, features_dir_for
    from eagle3.config.pipeline import with_overrides
    from flows.capture import capture_flow
    from flows.cli import app
    from flows.vocab import vocab_flow

    config = with_overrides(tiny_config, [f"root={tmp_path / 'root'}", "vocab.draft_vocab_size=64"])
    regen = write_regen_stage(config.root_path / "regen" / "flowfp", rows=4, seed=5)
    # the CLI's bar
    assert capture_progress(regen, features_dir_for(config, regen)) == Progress(done=0, total=8)
    source = capture_flow(config, regen_dir=str(regen))
    features = source.features_dir
    assert features == features_dir_for(config, regen)
    assert capture_progress(regen, features).percent == 100.0
    assert capture_progress(regen, features, shard_ids=[1]) == Progress(done=4, total=4)
    manifest = Manifest.read(features)
    assert manifest is not None and manifest.stats["rows"] + manifest.stats["quarantined"] == 8
    assert sorted(p.name for p in features.glob("shard-*.parquet")) == [
        "shard-00000.parquet",
        "shard-00001.parquet",
    ]
    stamp = {p.name: p.stat().st_mtime_ns for p in features.glob("shard-*.parquet")}
    rerun = CliRunner().invoke(
        app,
        [
            "capture",
            "--regen-dir",
            str(regen),
            "--set",
            f"root={config.root}",
            "--set",
            "vocab.draft_vocab_size=64",
        ],
    )
    assert rerun.exit_code == 0, rerun.output
    assert rerun.stdout.strip() == f"features: {features}"
    # nothing redone
    assert {p.name: p.stat().st_mtime_ns for p in features.glob("shard-*.parquet")} == stamp
    vocab = Path(vocab_flow(config, source))
    assert vocab.exists() and Manifest.read(vocab.parent).stats["draft_vocab_size"] == 64
