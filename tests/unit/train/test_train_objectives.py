"""The LK objectives (``train.loss``) against their formulas on small hand-built distributions:
alpha is 1 - TV, the loss and its gradient in the logits match the closed forms, the lambda mix
weighs KL by the detached mean acceptance, masked-out positions stay finite, top-k teachers are the
truncated and renormalised distribution, and the unroll keeps the per-step weights and the
global-batch normalisation of the KL objective."""

from __future__ import annotations

import math

import pytest
import torch
from train_synthetic import synthetic

from eagle3.capture.head import target_topk
from eagle3.train.loss import TTTObjective, batch_target, step_masks, topk_distribution
from eagle3.train.objectives import acceptance, kl_divergence, position_loss
from eagle3.train.trainer import build_draft

V = 7


def _pair(seed: int, b: int = 2, t: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(2 * torch.randn(b, t, V, generator=g), -1), 2 * torch.randn(
        b, t, V, generator=g
    )


def _grad(kind: str, target, logits, mask, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    z = logits.clone().requires_grad_(True)
    loss = position_loss(
        kind,
        target,
        torch.log_softmax(z, -1),
        mask,
        kl_scale=kw.get("kl_scale", 1.0),
        kl_decay=kw.get("kl_decay", 3.0),
    ).sum()
    loss.backward()
    return loss.detach(), z.grad


def _alpha_grad(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """d alpha / dz for alpha = sum_v min(p_v, q_v), q = softmax(z): q_j (1[q_j < p_j] - sum_v 1[q_v
    < p_v] q_v)."""
    below = (q < p).float()
    return q * (below - (below * q).sum(-1, keepdim=True))


def test_alpha_is_one_minus_total_variation_and_one_only_for_equal_distributions():
    p, z = _pair(0)
    q = torch.softmax(z, -1)
    torch.testing.assert_close(acceptance(p, q.log()), 1 - 0.5 * (p - q).abs().sum(-1))
    torch.testing.assert_close(acceptance(p, p.log()), torch.ones(2, 3))
    one_hot = torch.zeros(V)
    one_hot[2] = 1.0
    assert float(acceptance(one_hot, torch.log_softmax(z[0, 0], -1))) == pytest.approx(
        float(q[0, 0, 2])
    )


def test_lk_alpha_loss_and_gradient_match_the_formula():
    p, z = _pair(1)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    loss, grad = _grad("lk_alpha", p, z, mask)
    q = torch.softmax(z, -1)
    alpha = torch.minimum(p, q).sum(-1)
    assert float(loss) == pytest.approx(float((-alpha.log() * mask).sum()), rel=1e-6)
    want = -_alpha_grad(p, q) / alpha[..., None] * mask[..., None]
    torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-7)


def test_lk_lambda_mixes_kl_and_acceptance_by_the_detached_mean_alpha():
    p, z = _pair(2)
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    scale, decay = 0.7, 2.5
    loss, grad = _grad("lk_lambda", p, z, mask, kl_scale=scale, kl_decay=decay)
    q = torch.softmax(z, -1)
    alpha = torch.minimum(p, q).sum(-1)
    w = scale * math.exp(-decay * float((alpha * mask).sum() / mask.sum()))
    kl = (p * (p.log() - q.log())).sum(-1)
    assert float(loss) == pytest.approx(
        float(((w * kl + (1 - w) * (1 - alpha)) * mask).sum()), rel=1e-5
    )
    # d KL / dz = q - p; w has no gradient
    want = (w * (q - p) - (1 - w) * _alpha_grad(p, q)) * mask[..., None]
    torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-7)


def test_kl_objective_is_the_soft_cross_entropy_and_kl_differs_by_the_entropy_only():
    p, z = _pair(3)
    mask = torch.ones(2, 3)
    loss, grad = _grad("kl", p, z, mask)
    logq = torch.log_softmax(z, -1)
    assert float(loss) == pytest.approx(float(-(p * logq).sum()), rel=1e-6)
    torch.testing.assert_close(grad, torch.softmax(z, -1) - p)
    entropy = -(p * p.log()).sum(-1)
    torch.testing.assert_close(kl_divergence(p, logq), -(p * logq).sum(-1) - entropy)


@pytest.mark.parametrize("kind", ["lk_alpha", "lk_lambda"])
def test_positions_without_a_teacher_are_zero_and_keep_the_gradient_finite(kind):
    p, z = _pair(4)
    p[0, 1] = 0.0  # a shifted-out position: no teacher, alpha 0
    mask = torch.ones(2, 3)
    mask[0, 1] = 0.0
    loss, grad = _grad(kind, p, z, mask)
    assert (
        math.isfinite(float(loss))
        and bool(grad.isfinite().all())
        and torch.equal(grad[0, 1], torch.zeros(V))
    )


def test_topk_teacher_drops_the_unknown_tail_and_renormalises_what_lk_sees():
    """k = 2 of a hand-built target: the tail's mass is unknown, the top-2 is renormalised; the
    draft's mass on tail ids earns no acceptance."""
    # target ids by probability (the last is padding, probability 0)
    ids = torch.tensor([[[4, 1, 0]]])
    probs = torch.tensor([[[0.5, 0.3, 0.0]]])  # 0.2 of the mass is outside the top-2
    teacher, _ = topk_distribution(ids, probs, torch.arange(V), V)
    torch.testing.assert_close(teacher[0, 0], torch.tensor([0, 0.375, 0, 0, 0.625, 0, 0]))
    q = torch.tensor([0.1, 0.3, 0.0, 0.0, 0.4, 0.2, 0.0])
    z = q.clamp(min=1e-30).log().view(1, 1, V)
    loss, _ = _grad("lk_alpha", teacher, z, torch.ones(1, 1))
    # min(.375,.3) + min(.625,.4)
    assert float(loss) == pytest.approx(-math.log(0.3 + 0.4), rel=1e-5)


@pytest.mark.parametrize("kind", ["lk_alpha", "lk_lambda"])
def test_unroll_keeps_per_step_weights_and_global_normalisation_and_a_full_topk_equals_the_exact_teacher(
    kind,
):
    _, inputs, batches = synthetic()
    steps, decay = 3, 0.8
    batch = batches[0]
    draft = build_draft(inputs, 0)
    objective = TTTObjective(draft, steps=steps, decay=decay, loss=kind)
    probs, in_vocab = batch_target(batch, inputs.head.lm_head, inputs.draft_ids)
    masks = step_masks(batch["loss_mask"], batch["attention_mask"], in_vocab, steps)
    denominators = torch.tensor([5.0, 7.0, 11.0])  # as if other ranks held more of the global batch
    with torch.no_grad():
        total, stats = objective(
            batch["input_ids"], batch["aux_hidden"], inputs.head.embed, probs, masks, denominators
        )
        assert float(total) == pytest.approx(
            sum(decay**k * float(stats[k, 0]) / float(denominators[k]) for k in range(steps)),
            rel=1e-5,
        )
        assert kind != "lk_alpha" or all(float(stats[k, 0]) > 0 for k in range(steps))
        ids, topk = target_topk(
            batch["last_hidden"], inputs.head.lm_head, inputs.head.lm_head.shape[0]
        )
        rest = {k: v for k, v in batch.items() if k != "last_hidden"}
        stored = batch_target(
            {**rest, "target_ids": ids.long(), "target_probs": topk},
            inputs.head.lm_head,
            inputs.draft_ids,
        )[0]
        again, _ = objective(
            batch["input_ids"], batch["aux_hidden"], inputs.head.embed, stored, masks, denominators
        )
    assert float(again) == pytest.approx(float(total), rel=1e-4)


def test_lk_mixing_weights_without_lk_lambda_are_refused_with_the_fix():
    from eagle3.config.base import ConfigError
    from eagle3.recipes import load_recipe

    with pytest.raises(ConfigError, match=r"set train\.loss=lk_lambda or drop train\.lk_kl_decay"):
        load_recipe("kimi_k2_5", ["train.lk_kl_decay=5"])
    assert (
        load_recipe("kimi_k2_5", ["train.loss=lk_lambda", "train.lk_kl_decay=5"]).train.lk_kl_decay
        == 5
    )
    with pytest.raises(ConfigError, match=r"train\.loss"):
        load_recipe("kimi_k2_5", ["train.loss=tv"])
