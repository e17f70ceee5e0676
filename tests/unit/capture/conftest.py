"""Fixtures for the capture tests: the tiny world's target, regen shards rendered with
the project renderer, and a config pointing at both."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
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


@pytest.fixture(scope="module")
def hf_backend(capture_model_dir):
    """The tiny target behind the hf capture backend (aux layers 2, 4, 5), float32 on one CPU
    thread."""
    import torch
    from transformers import AutoModelForCausalLM

    from eagle3.capture.hf import HFBackend

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(capture_model_dir, dtype=torch.float32)
    return HFBackend(model, [2, 4, 5])


@pytest.fixture
def make_config(capture_model_dir, tmp_path) -> Callable[..., PipelineConfig]:
    """``make_config(*overrides)``: a float32 CPU capture config for the tiny target under
    ``tmp_path``."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(capture_model_dir)

    def make(*overrides: str) -> PipelineConfig:
        base = PipelineConfig(
            name="capture-test",
            root=str(tmp_path / "root"),
            target=TargetConfig(
                model_path=str(capture_model_dir),
                num_layers=hf.num_hidden_layers,
                hidden_size=hf.hidden_size,
                vocab_size=hf.vocab_size,
                dtype="float32",
            ),
        )
        defaults = [
            "capture.dtype=float32",
            "capture.batch_tokens=512",
            "capture.max_seq_len=1024",
            "capture.row_group_bytes=262144",
        ]
        return with_overrides(base, [*defaults, *overrides])

    return make


def regen_rows(tokenizer, n: int, *, seed: int = 0) -> list[dict]:
    from eagle3.worlds.conversations import generate_conversations

    rows = []
    for conv in generate_conversations(n, seed=seed):
        rendered = render_conversation(tokenizer, conv)
        sid = hashlib.sha256(rendered.text.encode()).hexdigest()[:16]
        rows.append(
            {
                "sample_id": sid,
                "source": "test",
                "messages": conv,
                "input_ids": rendered.input_ids,
                "loss_mask": rendered.loss_mask,
                "finish_reason": "stop",
                "prompt_tokens": 0,
                "completion_tokens": sum(rendered.loss_mask),
                "server": "fixture",
                "latency_s": 0.0,
                "attempts": 1,
                "status": "ok",
                "error": None,
            }
        )
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


@pytest.fixture
def two_regen_shards(capture_tokenizer, tmp_path) -> Path:
    """A regen directory of two shards (3 and 4) of 12 and 8 other conversations."""
    out = tmp_path / "regen" / "fp-regen"
    write_regen_shard(out, 3, regen_rows(capture_tokenizer, 12))
    write_regen_shard(out, 4, regen_rows(capture_tokenizer, 8, seed=1))
    return out


def quantize_int4(src: Path, dst: Path, *, ignore: list[str]) -> Path:
    """``src`` re-saved as Kimi-K2.5's INT4 checkpoint is (compressed-tensors ``pack-quantized``:
    symmetric 4-bit weights in groups of 32 with a scale each, min-max calibrated), every Linear
    quantized but those in ``ignore``."""
    import shutil

    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    weights = {
        "num_bits": 4,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": 32,
    }
    apply_quantization_config(
        model,
        QuantizationConfig.model_validate(
            {
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
                "ignore": ignore,
            }
        ),
    )
    for module in model.modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is not None and scheme.weights is not None:
            groups = module.weight.detach().float().unflatten(-1, (-1, scheme.weights.group_size))
            scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights)
            module.weight_scale.data.copy_(scale)
            module.weight_zero_point.data.copy_(zero)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(dst)
    compressor.update_config(str(dst))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / name, dst / name)
    return dst


@pytest.fixture(scope="session")
def int4_model_dir(capture_model_dir, tmp_path_factory) -> Path:
    """The tiny target with its MLPs in INT4, attention and lm_head kept in bf16 (as Kimi-K2.5's
    experts are)."""
    return quantize_int4(
        capture_model_dir,
        tmp_path_factory.mktemp("int4") / "model",
        ignore=["lm_head", "re:.*self_attn.*"],
    )
