"""Fixtures shared by the gate and scaling tests: the tiny gate world, a tiny target, bench prompt
files, and a draft trained with the project's trainer (cached under ``EAGLE3_HOME``, keyed by the
target's weights)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle3.config.pipeline import PipelineConfig
from eagle3.config.target import TargetConfig

GATE_DRAFT_VOCAB = 512
# ---------------------------------------------------------------------------------------------------------------

TRAIN_PROMPTS, ANSWER_TOKENS, BENCH_PER_SET = 64, 40, 4


def _target_dir(request: pytest.FixtureRequest) -> Path:
    """The tiny world's target model directory."""
    return Path(request.getfixturevalue("tiny_world").model_dir)


def _bench_sets(out: Path) -> dict[str, str]:
    """Bench prompt files (``{"id", "prompt"}`` JSONL) of user prompts the draft never trained
    on."""
    from eagle3.worlds.conversations import generate_conversations

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
    """Distil a draft on the target's own greedy answers with the project's trainer, then export
    it."""
    from eagle3.data.template import render_prompt
    from eagle3.train.distributed import DistInfo
    from eagle3.train.export import export_draft
    from eagle3.train.identity import load_inputs
    from eagle3.train.trainer import train_on_source
    from eagle3.worlds.conversations import generate_conversations
    from eagle3.worlds.distil import (
        ListBatchSource,
        answer_sequences,
        batches_from_target,
        greedy_answers,
        write_draft_vocab,
    )

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    convs = [
        c for c in generate_conversations(TRAIN_PROMPTS * 2, seed=11) if c[0]["role"] == "user"
    ][:TRAIN_PROMPTS]
    prompts = [render_prompt(tokenizer, [c[0]]) for c in convs]
    answers = greedy_answers(
        target,
        prompts,
        max_new_tokens=ANSWER_TOKENS,
        eos_id=eos,
        pad_id=tokenizer.pad_token_id,
        batch_size=1,
    )
    sequences = answer_sequences(prompts, answers)
    vocab_size = config.target.vocab_size
    write_draft_vocab(
        sequences,
        vocab_size=vocab_size,
        draft_vocab_size=GATE_DRAFT_VOCAB,
        path=root / "vocab.safetensors",
    )
    batches = batches_from_target(
        target, sequences, layer_ids=config.sglang_layer_ids, batch_size=4
    )
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    inputs = load_inputs(config, root / "vocab.safetensors")
    train_on_source(config, ListBatchSource(batches), inputs, root / "draft", info)
    return export_draft(config, root / "draft", root / "vocab.safetensors", None, root / "export")


def _cached_draft(config: PipelineConfig, target: Any, tokenizer: Any, scratch: Path) -> Path:
    """The trained export, cached under EAGLE3_HOME by the target's weights hash (training takes a
    minute here)."""
    from eagle3.recipes import eagle3_home
    from eagle3.rundir.runroot import fingerprint, sha256_file

    key = fingerprint(
        "bench-draft-v1", sha256_file(Path(config.target.model_path) / "model.safetensors")
    )
    cached = eagle3_home() / "cache" / f"bench-draft-{key}"
    if not (cached / "model.safetensors").exists():
        export = _train_draft(config, target, tokenizer, scratch)
        tmp = cached.with_name(cached.name + f".tmp-{os.getpid()}")
        shutil.copytree(export, tmp)
        os.replace(tmp, cached)
    return cached


@pytest.fixture(scope="session")
def gate_world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Tiny target + bench sets + a trained, exported EAGLE-3 draft; ``config`` is set up for quick
    gates."""
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
            f"vocab.draft_vocab_size={GATE_DRAFT_VOCAB}",
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
            # rounds of 6 requests x ~16 tokens (< 1 s): 32-60% apart seen idle
            "gate.max_baseline_drift=1.0",
        ],
    )
    export = _cached_draft(config, target, tokenizer, root)
    return SimpleNamespace(
        config=config, export=export, tokenizer=tokenizer, model_dir=model_dir, root=root
    )
