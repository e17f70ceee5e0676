"""The TTT objective's bookkeeping: target distribution restricted to the draft vocab and renormalized, per-step
mask shifting, simulated accept length, and the warmup + cosine schedule."""

from __future__ import annotations

import pytest
import torch

from eagle3.train.loss import accept_length, shift_left, step_masks, target_distribution
from eagle3.train.trainer import lr_schedule


def test_target_distribution_is_renormalized_over_draft_ids_and_flags_argmax_outside():
    lm_head = torch.eye(4)  # logits == hidden
    hidden = torch.tensor([[[5.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 9.0]]])  # argmax 0 (in vocab), 3 (outside)
    draft_ids = torch.tensor([0, 1, 2])
    probs, in_vocab = target_distribution(hidden, lm_head, draft_ids, chunk=1)
    expected = torch.softmax(torch.tensor([5.0, 1.0, 0.0]), -1)
    torch.testing.assert_close(probs[0, 0], expected)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 2))
    assert in_vocab.tolist() == [[True, False]]


def test_step_k_mask_looks_at_the_token_k_plus_2_ahead_and_the_target_argmax_k_plus_1_ahead():
    t = 8
    loss_mask = torch.zeros(1, t)
    loss_mask[0, 5] = 1  # only token 5 is trained on
    attention = torch.ones(1, t, dtype=torch.bool)
    in_vocab = torch.ones(1, t, dtype=torch.bool)
    masks = step_masks(loss_mask, attention, in_vocab, steps=3)
    # step k at position p predicts token p + 2 + k: token 5 is predicted from p = 3, 2, 1 at steps 0, 1, 2
    assert [m[0].nonzero().flatten().tolist() for m in masks] == [[3], [2], [1]]
    in_vocab[0, 4] = False  # the target's argmax at 4 (predicting token 5) is outside the draft vocab
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
    assert f(10) == pytest.approx(1.0) and f(55) == pytest.approx(0.5) and f(100) == pytest.approx(0.0)
