"""Regen tasks called as plain functions (``task.fn``): plan, shard, finalize; the cache key ignores servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.config import PipelineConfig, RegenConfig, TargetConfig
from eagle3.data.parquet import ShardWriter
from eagle3.data.schema import PROMPT_SCHEMA
from eagle3.layout import ShardsFailed, shard_name
from eagle3.runroot import FileEntry, Manifest
from eagle3.serve.launch import reference_server
from tasks.regen import finalize_regen_task, plan_regen_task, regen_shard_task, server_limit_names


def _prompts(root: Path) -> Path:
    out, files = root / "prompts" / "fp", []
    for s in range(2):
        rows = [
            {
                "sample_id": f"{s}-{i}",
                "source": "t",
                "source_row": str(i),
                "n_user_turns": 1,
                "meta": "{}",
                "messages": [{"role": "user", "content": f"q {s} {i}"}],
                "input_ids": None,
                "loss_mask": None,
            }
            for i in range(3)
        ]
        with ShardWriter(out, PROMPT_SCHEMA, start_index=s) as writer:
            writer.write_rows(rows)
        [info] = writer.close()
        files.append(FileEntry.of(info.path, rows=info.rows, base=out))
    Manifest(stage="prompts", fingerprint="fp", files=files).write(out)
    return out


def test_shard_task_cache_key_ignores_servers_and_is_none_until_the_shard_exists(tmp_path):
    key = regen_shard_task.cache_key_fn
    params = {"plan": {"regen_dir": str(tmp_path)}, "fingerprint": "f", "shard_index": 3}
    assert key(None, {**params, "servers": ["http://a"]}) is None
    (tmp_path / shard_name(3)).write_bytes(b"rows")
    a = key(None, {**params, "servers": ["http://a"]})
    b = key(None, {**params, "plan": {"regen_dir": str(tmp_path), "x": 2}, "servers": ["http://b"]})
    assert a is not None and a == b
    assert key(None, {**params, "fingerprint": "g"}) != a
    (tmp_path / shard_name(3)).write_bytes(b"rebuilt rows")
    assert key(None, params) != a
    assert server_limit_names(["http://10.0.0.1:30000"]) == ["regen-server-10-0-0-1-30000"]


def test_plan_shard_finalize_tasks(prefect_harness, tmp_path):
    from eagle3.dev.tiny_target import build_model, build_tokenizer

    model_dir = tmp_path / "model"
    tokenizer = build_tokenizer([f"q {i} text" for i in range(200)], vocab_size=300)
    build_model(tokenizer, num_layers=4, max_position_embeddings=128).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    prompts = _prompts(tmp_path)
    with reference_server(None, extra_args=["--synthetic-tokens", "2"]) as server:
        config = PipelineConfig(
            name="t",
            root=str(tmp_path),
            target=TargetConfig(model_path=str(model_dir), num_layers=8, hidden_size=128, vocab_size=300),
            regen=RegenConfig(servers=[server.url], max_new_tokens=2),
        )
        planned = plan_regen_task.fn(config, str(prompts), [1])
        assert planned["shard_ids"] == [1]
        plan = planned["plan"]
        report = regen_shard_task.fn(plan, plan["fingerprint"], 1, [server.url])
    assert report["state"] == "done" and report["rows"] == 3
    summary = finalize_regen_task.fn(plan, [])
    assert summary["shards_pending"] == [0] and not summary["done"]
    assert json.loads((Path(plan["regen_dir"]) / "failed_shards.json").read_text()) == []
    with pytest.raises(ShardsFailed, match=r"regen failed for shards \[0\].*eagle3 retry-shards --run .* --failed"):
        finalize_regen_task.fn(plan, [0])  # the failure policy: recorded, no manifest, the re-trigger command
    assert json.loads((Path(plan["regen_dir"]) / "failed_shards.json").read_text()) == [0]
    assert not (Path(plan["regen_dir"]) / "manifest.json").exists()
