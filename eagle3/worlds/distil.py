"""Distillation data built in memory from a (tiny) target: its own greedy answers and the draft vocab over them.

Where a draft is trained without running the regen and capture stages (the learning benchmark, the train and gate
test worlds), this gives the data those stages would give, in seconds on CPU: prompt + target answer sequences with
the loss mask over the answer, and the draft vocab of the loss tokens, selected by the vocab stage's own rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from eagle3.model.vocab import save_vocab
from eagle3.train.vocab import build_vocab

Sequences = list[tuple[list[int], list[int]]]  # (input_ids, loss_mask) pairs


def _cut_after_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[: ids.index(eos_id) + 1] if eos_id in ids else ids


@torch.no_grad()
def greedy_answers(
    target: Any, prompts: Sequence[list[int]], *, max_new_tokens: int, eos_id: int, pad_id: int, batch_size: int = 32
) -> list[list[int]]:
    """The target's greedy continuation of each prompt, cut after the first ``eos_id``.

    ``batch_size > 1`` left-pads prompts into one ``generate`` call (fast; padding may flip a near tie), ``1``
    decodes each prompt alone (exactly what a speculative decoder must reproduce).
    """
    answers: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        out = target.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos_id,
            pad_token_id=pad_id,
        )
        answers += [_cut_after_eos(row, eos_id) for row in out[:, width:].tolist()]
    return answers


def answer_sequences(prompts: Sequence[list[int]], answers: Sequence[list[int]]) -> Sequences:
    """``prompt + answer`` with the loss mask over the answer only."""
    return [(list(p) + list(a), [0] * len(p) + [1] * len(a)) for p, a in zip(prompts, answers, strict=True)]


def write_draft_vocab(sequences: Sequences, *, vocab_size: int, draft_vocab_size: int, path: Path) -> Path:
    """Count the loss tokens and save the draft vocab the vocab stage would select from them."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in sequences:
        counts.index_add_(0, torch.tensor(ids), torch.tensor(mask, dtype=torch.long))
    return save_vocab(build_vocab(counts, draft_vocab_size), path)
