"""A tiny draft-training world: the tiny world's target, target-generated (greedy) answers, a draft
vocab, a config, and training batches captured online from the target (the batch dicts the trainer
reads)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig

DRAFT_VOCAB = 512
TRAIN_PROMPTS, HELD_OUT = 64, 20


@pytest.fixture(scope="session")
def draft_world(tiny_world, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3.data.template import render_prompt
    from eagle3.worlds.conversations import generate_conversations
    from eagle3.worlds.distil import (
        answer_sequences,
        batches_from_target,
        greedy_answers,
        write_draft_vocab,
    )

    model_dir = Path(tiny_world.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    convs = generate_conversations(TRAIN_PROMPTS + HELD_OUT, seed=11)
    prompts = [render_prompt(tokenizer, [c[0]] if c[0]["role"] == "user" else c[:2]) for c in convs]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    train_prompts = prompts[:TRAIN_PROMPTS]
    answers = greedy_answers(
        target, train_prompts, max_new_tokens=40, eos_id=eos, pad_id=tokenizer.pad_token_id
    )
    sequences = answer_sequences(train_prompts, answers)
    root = tmp_path_factory.mktemp("draft-root")
    vocab_path = write_draft_vocab(
        sequences,
        vocab_size=target.config.vocab_size,
        draft_vocab_size=DRAFT_VOCAB,
        path=root / "vocab.safetensors",
    )
    hf = target.config
    base = PipelineConfig(
        name="draft-test",
        root=str(root),
        target=TargetConfig(
            model_path=str(model_dir),
            num_layers=hf.num_hidden_layers,
            hidden_size=hf.hidden_size,
            vocab_size=hf.vocab_size,
            context_length=1024,
            dtype="float32",
        ),
    )
    config = with_overrides(
        base,
        [
            f"vocab.draft_vocab_size={DRAFT_VOCAB}",
            "train.precision=fp32",
            "train.device=cpu",
            "train.lr=3e-3",
            "train.batch_size=4",
            "train.log_every=1",
            "train.save_every=1000",
            "train.ttt_steps=4",
            "speculative.num_steps=3",
            "speculative.num_draft_tokens=4",
        ],
    )
    batches = batches_from_target(
        target, sequences, layer_ids=config.sglang_layer_ids, batch_size=4
    )
    return SimpleNamespace(
        model_dir=model_dir,
        tokenizer=tokenizer,
        target=target,
        config=config,
        vocab_path=vocab_path,
        batches=batches,
        sequences=sequences,
        held_out=prompts[TRAIN_PROMPTS:],
        eos=eos,
    )
