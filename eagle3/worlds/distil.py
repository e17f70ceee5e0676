"""Distillation data built in memory from a (tiny) target: its own greedy answers, the draft vocab
over them, and training batches of their hidden states.

Where a draft is trained without running the regen and capture stages (the learning benchmark, the
train and gate test worlds), this gives the data those stages would give, in seconds on CPU: prompt
+ target answer sequences with the loss mask over the answer, the draft vocab of the loss tokens,
  selected by the vocab stage's own
rule, and the batches the trainer reads (``batches_from_target``, served by ``ListBatchSource``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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
    target: Any,
    prompts: Sequence[list[int]],
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    batch_size: int = 32,
) -> list[list[int]]:
    """The target's greedy continuation of each prompt, cut after the first ``eos_id``.

    ``batch_size > 1`` left-pads prompts into one ``generate`` call (fast; padding may flip a near
    tie), ``1`` decodes each prompt alone (exactly what a speculative decoder must reproduce).
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
    return [
        (list(p) + list(a), [0] * len(p) + [1] * len(a))
        for p, a in zip(prompts, answers, strict=True)
    ]


def write_draft_vocab(
    sequences: Sequences, *, vocab_size: int, draft_vocab_size: int, path: Path
) -> Path:
    """Count the loss tokens and save the draft vocab the vocab stage would select from them."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in sequences:
        counts.index_add_(0, torch.tensor(ids), torch.tensor(mask, dtype=torch.long))
    return save_vocab(build_vocab(counts, draft_vocab_size), path)


class ListBatchSource:
    """In-memory global batches; rank ``r`` of ``w`` trains on rows ``r::w`` of each (tests,
    benchmarks)."""

    def __init__(
        self, batches: list[dict[str, torch.Tensor]], *, rank: int = 0, world_size: int = 1
    ) -> None:
        self.batches, self.rank, self.world_size = batches, rank, world_size
        self.epoch, self.index = 0, 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while self.index < len(self.batches):
            batch = self.batches[self.index]
            self.index += 1
            yield {k: v[self.rank :: self.world_size] for k, v in batch.items()}
        self.epoch, self.index = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def origin(self) -> str:
        return f"in-memory batch {self.index - 1} (epoch {self.epoch})"

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


@torch.no_grad()
def batches_from_target(
    target: torch.nn.Module,
    sequences: list[tuple[list[int], list[int]]],
    *,
    layer_ids: list[int],
    batch_size: int,
) -> list[dict[str, torch.Tensor]]:
    """Training batches captured in memory from an HF target: the batch dict the trainer reads.

    ``sequences`` are ``(input_ids, loss_mask)`` pairs; ``layer_ids`` are HF ``hidden_states``
    indices (the ``input_of_layer`` convention); ``last_hidden`` is ``hidden_states[-1]``, the
    post-norm input of ``lm_head``. Right padding with id 0 and ``attention_mask`` False on padding.
    """
    batches = []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width)
        attn = torch.zeros(len(chunk), width, dtype=torch.bool)
        for row, (seq, loss) in enumerate(chunk):
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = torch.tensor(loss, dtype=torch.float32)
            attn[row, : len(seq)] = True
        out = target(input_ids=ids, attention_mask=attn.long(), output_hidden_states=True)
        aux = torch.cat(
            [out.hidden_states[i] for i in layer_ids], dim=-1
        )  # 3 x [B, T, H] -> [B, T, 3H]
        batches.append(
            {
                "input_ids": ids,
                "loss_mask": mask,
                "attention_mask": attn,
                "aux_hidden": aux.float(),
                "last_hidden": out.hidden_states[-1].float(),
            }
        )
    return batches
