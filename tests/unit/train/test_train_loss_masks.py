"""The TTT objective's bookkeeping: target distribution restricted to the draft vocab and
renormalized (from the final state or from the stored top-k), per-step mask shifting, simulated
accept length, and the warmup + cosine schedule."""

from __future__ import annotations

import pytest
import torch
from train_synthetic import synthetic

from eagle3.capture.head import target_topk
from eagle3.train.loss import (
    TTTObjective,
    accept_length,
    batch_target,
    shift_left,
    step_masks,
    target_distribution,
    topk_distribution,
)
from eagle3.train.trainer import build_draft, lr_schedule


def test_target_distribution_is_renormalized_over_draft_ids_and_flags_argmax_outside():
    lm_head = torch.eye(4)  # logits == hidden
    # argmax 0 (in vocab), 3 (outside)
    hidden = torch.tensor([[[5.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 9.0]]])
    draft_ids = torch.tensor([0, 1, 2])
    probs, in_vocab = target_distribution(hidden, lm_head, draft_ids, chunk=1)
    expected = torch.softmax(torch.tensor([5.0, 1.0, 0.0]), -1)
    torch.testing.assert_close(probs[0, 0], expected)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 2))
    assert in_vocab.tolist() == [[True, False]]


def test_topk_distribution_drops_ids_outside_the_draft_vocab_and_flags_the_top1():
    # the last position is padding (probability 0)
    ids = torch.tensor([[[3, 0, 1], [1, 2, 3], [0, 0, 0]]])
    probs = torch.tensor([[[0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.0, 0.0, 0.0]]])
    dense, in_vocab = topk_distribution(ids, probs, torch.tensor([0, 1, 2]), vocab_size=4)
    torch.testing.assert_close(
        dense[0], torch.tensor([[0.6, 0.4, 0.0], [0.0, 2 / 3, 1 / 3], [0.0, 0.0, 0.0]])
    )
    # top-1 3 is outside; padding is masked by attention
    assert in_vocab.tolist() == [[False, True, True]]


def _stored_topk(batch: dict, lm_head: torch.Tensor, k: int) -> dict:
    """``batch`` as the loader yields it from ``fp8_topk`` features: top-k as stored (int32,
    float16)."""
    ids, probs = target_topk(batch["last_hidden"], lm_head, k)
    rest = {key: v for key, v in batch.items() if key != "last_hidden"}
    return {**rest, "target_ids": ids.to(torch.int32).long(), "target_probs": probs.half().float()}


def test_topk_of_the_whole_vocab_gives_the_final_states_loss_and_a_small_k_stays_close():
    _, inputs, batches = synthetic()
    objective = TTTObjective(build_draft(inputs, 0), steps=3, decay=0.8)

    def loss(batch: dict) -> float:
        probs, in_vocab = batch_target(batch, inputs.head.lm_head, inputs.draft_ids)
        masks = step_masks(batch["loss_mask"], batch["attention_mask"], in_vocab, 3)
        total, _ = objective(
            batch["input_ids"],
            batch["aux_hidden"],
            inputs.head.embed,
            probs,
            masks,
            masks.sum(dim=(1, 2)).clamp(min=1.0),
        )
        return float(total.detach())

    vocab = inputs.head.lm_head.shape[0]
    for batch in batches:
        reference = loss(batch)
        assert loss(_stored_topk(batch, inputs.head.lm_head, vocab)) == pytest.approx(
            reference, rel=1e-4
        )
        assert loss(_stored_topk(batch, inputs.head.lm_head, vocab // 4)) == pytest.approx(
            reference, rel=0.01
        )


def test_step_k_mask_looks_at_the_token_k_plus_2_ahead_and_the_target_argmax_k_plus_1_ahead():
    t = 8
    loss_mask = torch.zeros(1, t)
    loss_mask[0, 5] = 1  # only token 5 is trained on
    attention = torch.ones(1, t, dtype=torch.bool)
    in_vocab = torch.ones(1, t, dtype=torch.bool)
    masks = step_masks(loss_mask, attention, in_vocab, steps=3)
    # step k at position p predicts token p + 2 + k: token 5 is predicted from p = 3, 2, 1 at steps
    # 0, 1, 2
    assert [m[0].nonzero().flatten().tolist() for m in masks] == [[3], [2], [1]]
    # the target's argmax at 4 (predicting token 5) is outside the draft vocab
    in_vocab[0, 4] = False
    assert step_masks(loss_mask, attention, in_vocab, steps=3).sum() == 0


def test_padding_is_never_trained_on():
    loss_mask = torch.ones(1, 6)
    attention = torch.tensor([[True, True, True, True, False, False]])
    masks = step_masks(loss_mask, attention, torch.ones(1, 6, dtype=torch.bool), steps=2)
    assert masks[0, 0].tolist() == [1, 1, 0, 0, 0, 0] and masks[1, 0].tolist() == [1, 0, 0, 0, 0, 0]


def test_shift_left_zero_fills_and_handles_shifts_past_the_end():
    x = torch.arange(5)[None]
    assert shift_left(x, 2).tolist() == [[2, 3, 4, 0, 0]] and shift_left(x, 7).tolist() == [[0] * 5]


def test_simulated_accept_length_is_one_plus_sum_of_running_products():
    assert accept_length([0.8, 0.5, 0.5]) == pytest.approx(1 + 0.8 + 0.4 + 0.2)
    assert accept_length([0.0, 1.0]) == 1.0


def test_schedule_warms_up_linearly_then_decays_to_zero():
    f = lr_schedule(100, 0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert (
        f(10) == pytest.approx(1.0) and f(55) == pytest.approx(0.5) and f(100) == pytest.approx(0.0)
    )
