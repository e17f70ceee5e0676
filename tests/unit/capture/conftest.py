"""Fixtures for the capture tests: the tiny world's target, regen shards rendered with
the project renderer, and a config pointing at both."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from eagle3.config import PipelineConfig, TargetConfig, with_overrides
from eagle3.data.parquet import ShardWriter
from eagle3.data.template import render_conversation
from eagle3.regen.schema import REGEN_SCHEMA


@pytest.fixture(scope="session")
def capture_model_dir(tiny_world) -> Path:
    """The tiny world's target model directory."""
    return Path(tiny_world.model_dir)


@pytest.fixture(scope="session")
def capture_tokenizer(capture_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(capture_model_dir)


@pytest.fixture
def make_config(capture_model_dir, tmp_path) -> Callable[..., PipelineConfig]:
    """``make_config(*overrides)``: a float32 CPU capture config for the tiny target under ``tmp_path``."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(capture_model_dir)

    def make(*overrides: str) -> PipelineConfig:
        base = PipelineConfig(
            name="capture-test",
            root=str(tmp_path / "root"),
            target=TargetConfig(model_path=str(capture_model_dir), num_layers=hf.num_hidden_layers,
                                hidden_size=hf.hidden_size, vocab_size=hf.vocab_size, dtype="float32"),
        )
        defaults = ["capture.dtype=float32", "capture.batch_tokens=512", "capture.max_seq_len=1024",
                    "capture.row_group_bytes=262144"]
        return with_overrides(base, [*defaults, *overrides])

    return make


def regen_rows(tokenizer, n: int, *, seed: int = 0) -> list[dict]:
    from eagle3.dev.samples import generate_conversations

    rows = []
    for conv in generate_conversations(n, seed=seed):
        rendered = render_conversation(tokenizer, conv)
        sid = hashlib.sha256(rendered.text.encode()).hexdigest()[:16]
        rows.append({
            "sample_id": sid, "source": "test", "messages": conv, "input_ids": rendered.input_ids,
            "loss_mask": rendered.loss_mask, "finish_reason": "stop", "prompt_tokens": 0,
            "completion_tokens": sum(rendered.loss_mask), "server": "fixture", "latency_s": 0.0, "attempts": 1,
            "status": "ok", "error": None,
        })
    return rows


def write_regen_shard(out_dir: Path, index: int, rows: list[dict]) -> Path:
    with ShardWriter(out_dir, REGEN_SCHEMA, start_index=index) as writer:
        writer.write_rows(rows)
        (info,) = writer.close()
    return info.path


@pytest.fixture
def regen_shard(capture_tokenizer, tmp_path) -> Path:
    """One regen shard (index 3) of 12 rendered conversations."""
    return write_regen_shard(tmp_path / "regen" / "fp-regen", 3, regen_rows(capture_tokenizer, 12))
