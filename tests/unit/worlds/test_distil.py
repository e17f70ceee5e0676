"""In-memory distillation data: greedy answers cut at eos, answer-only loss masks, the vocab stage's
selection."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3.data.template import render_prompt
from eagle3.model.vocab import load_vocab
from eagle3.worlds.distil import answer_sequences, greedy_answers, write_draft_vocab


def test_greedy_answers_stop_at_eos_and_batching_keeps_prompt_order(tiny_world):
    model_dir = Path(tiny_world.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    questions = [
        "What is 2 + 3?",
        "Write a haiku about rain.",
        "Hi! How can I sleep better at night?",
    ]
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    alone = greedy_answers(target, prompts, max_new_tokens=24, eos_id=eos, pad_id=pad, batch_size=1)
    batched = greedy_answers(
        target, prompts, max_new_tokens=24, eos_id=eos, pad_id=pad, batch_size=3
    )
    for answer in alone + batched:
        assert answer and (answer[-1] == eos or len(answer) == 24) and eos not in answer[:-1]
    # distinct prompts, distinct answers: order is kept
    assert len({tuple(a) for a in alone}) == len(prompts)
    # left padding may flip a near tie
    assert sum(a == b for a, b in zip(alone, batched, strict=True)) >= 2


def test_answer_sequences_mask_the_answer_only_and_refuse_unpaired_lists():
    [(ids, mask)] = answer_sequences([[1, 2, 3]], [[7, 8]])
    assert ids == [1, 2, 3, 7, 8] and mask == [0, 0, 0, 1, 1]
    with pytest.raises(ValueError):
        answer_sequences([[1], [2]], [[3]])


def test_draft_vocab_counts_loss_tokens_only(tmp_path):
    sequences = answer_sequences([[9, 9, 9, 9]], [[4, 4, 5]])  # id 9 is prompt-only
    vocab = load_vocab(
        write_draft_vocab(sequences, vocab_size=12, draft_vocab_size=3, path=tmp_path / "v.st")
    )
    assert vocab.counts.tolist()[4:6] == [2, 1] and int(vocab.counts[9]) == 0
    assert vocab.target_ids.tolist() == [0, 4, 5]  # both loss ids, padded with the lowest unseen id
