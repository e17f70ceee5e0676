"""Fixtures of the serving tests: a tiny target model directory, a small pipeline config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.config.pipeline import PipelineConfig
from eagle3.config.server import ServerLaunchConfig
from eagle3.config.target import TargetConfig


@pytest.fixture(scope="session")
def serve_model_dir(tiny_world) -> Path:
    """The tiny world's target model directory."""
    return Path(tiny_world.model_dir)


@pytest.fixture
def launch_config(tmp_path: Path) -> PipelineConfig:
    """A pipeline config of a small programmatic target (L=8, H=128, vocab 2048) served by SGLang on
    GPUs."""
    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "hidden_size": 128,
                "vocab_size": 2048,
            }
        )
    )
    target = TargetConfig(
        model_path=str(model), num_layers=8, hidden_size=128, vocab_size=2048, context_length=1024
    )
    server = ServerLaunchConfig(engine="sglang")
    return PipelineConfig(
        name="launch-test", root=str(tmp_path / "root"), target=target, server=server
    )
