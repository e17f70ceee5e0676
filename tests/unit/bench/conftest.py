"""Fixtures of the bench tests: a small pipeline config and a factory of programmatic draft exports."""

from __future__ import annotations

import json
import os
import shutil
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
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True},
    }
    cfg.update(overrides)
    return cfg


def export_tensors(cfg: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tensors = {k: torch.randn(shape, generator=gen) * 0.02 for k, shape in expected_shapes(cfg).items()}
    targets = torch.randperm(cfg["vocab_size"], generator=gen)[: cfg["draft_vocab_size"]].sort().values
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
    """``make_export(name, mutate=fn(cfg, tensors), **config_overrides)`` writes an export dir and returns it."""

    def make(name: str = "export", mutate: Callable[[dict, dict], None] | None = None, **overrides: Any) -> Path:
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
        json.dumps({"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": H, "vocab_size": VOCAB})
    )
    return PipelineConfig(
        name="bench-test",
        root=str(tmp_path / "root"),
        target=TargetConfig(
            model_path=str(model), num_layers=LAYERS, hidden_size=H, vocab_size=VOCAB, context_length=1024
        ),
    )


# ---------------------------------------------------------------------------------------------------------------
# The tiny gate world: tiny target, bench prompt files, and a draft trained with the project's trainer
# ---------------------------------------------------------------------------------------------------------------

TRAIN_PROMPTS, ANSWER_TOKENS, BENCH_PER_SET = 64, 40, 4


def _target_dir(request: pytest.FixtureRequest) -> Path:
    """The tiny world's target model directory."""
    return Path(request.getfixturevalue("tiny_world").model_dir)


def _bench_sets(out: Path) -> dict[str, str]:
    """Bench prompt files (``{"id", "prompt"}`` JSONL) of user prompts the draft never trained on."""
    from eagle3.worlds.samples import generate_conversations

    convs = generate_conversations(3 * BENCH_PER_SET * 3, seed=1234)
    sets = {}
    for k, name in enumerate(("chat", "code", "math")):
        rows = [
            {"id": f"{name}-{i}", "prompt": c[0]["content"]}
            for i, c in enumerate(convs[k::3])
            if c[0]["role"] == "user"
        ]
        path = out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows[:BENCH_PER_SET]))
        sets[name] = str(path)
    return sets


def _train_draft(config: PipelineConfig, target: Any, tokenizer: Any, root: Path) -> Path:
    """Distil a draft on the target's own greedy answers with the project's trainer, then export it."""
    from eagle3.data.template import render_prompt
    from eagle3.train.distributed import DistInfo
    from eagle3.train.export import export_draft
    from eagle3.train.trainer import ListBatchSource, batches_from_target, load_inputs, train_on_source
    from eagle3.worlds.distil import answer_sequences, greedy_answers, write_draft_vocab
    from eagle3.worlds.samples import generate_conversations

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    convs = [c for c in generate_conversations(TRAIN_PROMPTS * 2, seed=11) if c[0]["role"] == "user"][:TRAIN_PROMPTS]
    prompts = [render_prompt(tokenizer, [c[0]]) for c in convs]
    answers = greedy_answers(
        target, prompts, max_new_tokens=ANSWER_TOKENS, eos_id=eos, pad_id=tokenizer.pad_token_id, batch_size=1
    )
    sequences = answer_sequences(prompts, answers)
    vocab_size = config.target.vocab_size
    write_draft_vocab(sequences, vocab_size=vocab_size, draft_vocab_size=DRAFT_VOCAB, path=root / "vocab.safetensors")
    batches = batches_from_target(target, sequences, layer_ids=config.sglang_layer_ids, batch_size=4)
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    inputs = load_inputs(config, root / "vocab.safetensors")
    train_on_source(config, ListBatchSource(batches), inputs, root / "draft", info)
    return export_draft(config, root / "draft", root / "vocab.safetensors", None, root / "export")


def _cached_draft(config: PipelineConfig, target: Any, tokenizer: Any, scratch: Path) -> Path:
    """The trained export, cached under EAGLE3_HOME by the target's weights hash (training takes a minute here)."""
    from eagle3.recipes import eagle3_home
    from eagle3.rundir.runroot import fingerprint, sha256_file

    key = fingerprint("bench-draft-v1", sha256_file(Path(config.target.model_path) / "model.safetensors"))
    cached = eagle3_home() / "cache" / f"bench-draft-{key}"
    if not (cached / "model.safetensors").exists():
        export = _train_draft(config, target, tokenizer, scratch)
        tmp = cached.with_name(cached.name + f".tmp-{os.getpid()}")
        shutil.copytree(export, tmp)
        os.replace(tmp, cached)
    return cached


@pytest.fixture(scope="session")
def gate_world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Tiny target + bench sets + a trained, exported EAGLE-3 draft; ``config`` is set up for quick gates."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3.config.pipeline import with_overrides

    torch.set_num_threads(1)
    model_dir = _target_dir(request)
    root = tmp_path_factory.mktemp("gate-world")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf = target.config
    base = PipelineConfig(
        name="gate-test",
        root=str(root / "run"),
        target=TargetConfig(
            model_path=str(model_dir),
            num_layers=hf.num_hidden_layers,
            hidden_size=hf.hidden_size,
            vocab_size=hf.vocab_size,
            context_length=1024,
            dtype="float32",
        ),
    )
    sets = _bench_sets(root)
    config = with_overrides(
        base,
        [
            f"vocab.draft_vocab_size={DRAFT_VOCAB}",
            "train.precision=fp32",
            "train.device=cpu",
            "train.lr=3e-3",
            "train.batch_size=4",
            "train.epochs=6",
            "train.ttt_steps=4",
            "train.save_every=100000",
            "train.log_every=50",
            "server.port=0",
            "server.max_running_requests=4",
            "speculative.num_steps=3",
            "speculative.num_draft_tokens=4",
            f"gate.prompt_sets={json.dumps(sets)}",
            f"gate.prompts_per_set={BENCH_PER_SET}",
            "gate.warmup_requests=1",
            "gate.max_new_tokens=32",
            "gate.traffic={1: 1, 2: 0}",  # 2 is measured (crossover, adaptive tiers), not weighed
            "gate.min_speedup=0.01",
            "gate.min_accept=1.2",
            "gate.min_rounds=2",
            "gate.max_rounds=3",
            "gate.max_baseline_drift=1.0",  # rounds of 6 requests x ~16 tokens (< 1 s): 32-60% apart seen idle
        ],
    )
    export = _cached_draft(config, target, tokenizer, root)
    return SimpleNamespace(config=config, export=export, tokenizer=tokenizer, model_dir=model_dir, root=root)
