"""The capture flow captures every ready regen shard, writes the manifest, skips finished shards on a re-run,
and the vocab flow builds the draft vocab from it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from eagle3.data.parquet import ShardWriter
from eagle3.data.template import render_conversation
from eagle3.regen.schema import REGEN_SCHEMA
from eagle3.runroot import Manifest


def _regen_stage(root: Path, tokenizer) -> Path:
    from eagle3.dev.samples import generate_conversations

    regen = root / "regen" / "flowfp"
    convs = generate_conversations(8, seed=5)
    for s in range(2):
        rows = []
        for conv in convs[s * 4 : (s + 1) * 4]:
            r = render_conversation(tokenizer, conv)
            rows.append(
                {
                    "sample_id": hashlib.sha256(r.text.encode()).hexdigest()[:16],
                    "source": "t",
                    "messages": conv,
                    "input_ids": r.input_ids,
                    "loss_mask": r.loss_mask,
                    "status": "ok",
                }
            )
        with ShardWriter(regen, REGEN_SCHEMA, start_index=s) as writer:
            writer.write_rows(rows)
    return regen


def test_capture_flow_then_vocab_flow(tiny_config, tiny_tokenizer, tmp_path, prefect_harness):
    from eagle3.config import with_overrides
    from flows.capture import capture_flow, vocab_flow

    config = with_overrides(tiny_config, [f"root={tmp_path / 'root'}", "vocab.draft_vocab_size=64"])
    regen = _regen_stage(config.root_path, tiny_tokenizer)
    payload = config.model_dump(mode="json")
    features = Path(capture_flow(payload, regen_dir=str(regen)))
    manifest = Manifest.read(features)
    assert manifest is not None and manifest.stats["rows"] + manifest.stats["quarantined"] == 8
    assert sorted(p.name for p in features.glob("shard-*.parquet")) == ["shard-00000.parquet", "shard-00001.parquet"]
    stamp = {p.name: p.stat().st_mtime_ns for p in features.glob("shard-*.parquet")}
    assert capture_flow(payload, regen_dir=str(regen)) == str(features)
    assert {p.name: p.stat().st_mtime_ns for p in features.glob("shard-*.parquet")} == stamp  # nothing redone
    vocab = Path(vocab_flow(payload, str(features)))
    assert vocab.exists() and Manifest.read(vocab.parent).stats["draft_vocab_size"] == 64
