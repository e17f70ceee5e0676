"""Fixtures of the bench tests: a small pipeline config and a factory of programmatic draft
exports."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from eagle3.config.pipeline import PipelineConfig
from eagle3.config.target import TargetConfig
from eagle3.model.export_format import expected_shapes

H, VOCAB, DRAFT_VOCAB, LAYERS = 128, 2048, 512, 8


def draft_config(**overrides: Any) -> dict[str, Any]:
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": H,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
            "use_aux_hidden_state": True,
        },
    }
    cfg.update(overrides)
    return cfg


def export_tensors(cfg: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        k: torch.randn(shape, generator=gen) * 0.02 for k, shape in expected_shapes(cfg).items()
    }
    targets = (
        torch.randperm(cfg["vocab_size"], generator=gen)[: cfg["draft_vocab_size"]].sort().values
    )
    tensors["d2t"] = targets - torch.arange(cfg["draft_vocab_size"])
    t2d = torch.zeros(cfg["vocab_size"], dtype=torch.bool)
    t2d[targets] = True
    tensors["t2d"] = t2d
    return tensors


def write_export(out: Path, cfg: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


@pytest.fixture
def make_export(tmp_path: Path) -> Callable[..., Path]:
    """``make_export(name, mutate=fn(cfg, tensors), **config_overrides)`` writes an export dir and
    returns it."""

    def make(
        name: str = "export", mutate: Callable[[dict, dict], None] | None = None, **overrides: Any
    ) -> Path:
        cfg = draft_config(**overrides)
        tensors = export_tensors(cfg)
        if mutate is not None:
            mutate(cfg, tensors)
        return write_export(tmp_path / name, cfg, tensors)

    return make


@pytest.fixture
def bench_config(tmp_path: Path) -> PipelineConfig:
    """A pipeline config whose target matches the programmatic exports (L=8, H=128, vocab 2048)."""
    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "hidden_size": H,
                "vocab_size": VOCAB,
            }
        )
    )
    return PipelineConfig(
        name="bench-test",
        root=str(tmp_path / "root"),
        target=TargetConfig(
            model_path=str(model),
            num_layers=LAYERS,
            hidden_size=H,
            vocab_size=VOCAB,
            context_length=1024,
        ),
    )
