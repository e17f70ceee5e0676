"""The capture flow captures every ready regen shard, writes the manifest, skips finished shards on a re-run,
and the vocab flow builds the draft vocab from it."""

from __future__ import annotations

from pathlib import Path

from eagle3.runroot import Manifest


def test_capture_flow_then_vocab_flow(tiny_config, write_regen_stage, tmp_path, prefect_harness):
    from eagle3.config import with_overrides
    from flows.capture import capture_flow, vocab_flow

    config = with_overrides(tiny_config, [f"root={tmp_path / 'root'}", "vocab.draft_vocab_size=64"])
    regen = write_regen_stage(config.root_path / "regen" / "flowfp", rows=4, seed=5)
    features = Path(capture_flow(config, regen_dir=str(regen)))
    manifest = Manifest.read(features)
    assert manifest is not None and manifest.stats["rows"] + manifest.stats["quarantined"] == 8
    assert sorted(p.name for p in features.glob("shard-*.parquet")) == ["shard-00000.parquet", "shard-00001.parquet"]
    stamp = {p.name: p.stat().st_mtime_ns for p in features.glob("shard-*.parquet")}
    assert capture_flow(config, regen_dir=str(regen)) == str(features)
    assert {p.name: p.stat().st_mtime_ns for p in features.glob("shard-*.parquet")} == stamp  # nothing redone
    vocab = Path(vocab_flow(config, str(features)))
    assert vocab.exists() and Manifest.read(vocab.parent).stats["draft_vocab_size"] == 64
