"""Per-position training objectives of one unrolled step (``train.loss``), given the teacher ``p``
and the draft's log-probabilities ``log q``, both over the draft vocab.

* ``kl`` (default, EAGLE-3's): soft cross-entropy ``-sum_v p_v log q_v``, forward KL(p || q) up to
  the teacher's entropy (same gradient).
* ``lk_alpha``: ``-log alpha`` with ``alpha = sum_v min(p_v, q_v) = 1 - TV(p, q)``, the probability
  that a token drafted from ``q`` is accepted by speculative sampling against ``p`` (LK losses,
  arXiv 2602.23881). It aims at the quantity serving pays for rather than at a proxy; ``-log`` keeps
  the gradient alive where ``alpha`` is small.
* ``lk_lambda``: ``w * KL(p || q) + (1 - w) * (1 - alpha)`` with ``w = kl_scale * exp(-kl_decay *
  mean(alpha))``, ``mean(alpha)`` over the step's masked positions of the global batch, detached.
  The schedule is the model's own progress, not the step count: while the draft is poor (alpha ~0)
  the objective is KL, whose dense gradient over the whole vocab moves a random head fastest; as
  alpha rises the weight moves to the acceptance rate itself (defaults ``kl_scale`` 1, ``kl_decay``
  3: w = 1 at alpha 0, 0.22 at 0.5, 0.09 at 0.8; our choice, not tuned). KL here is the true
  divergence (``sum p log p`` subtracted), so the logged value means what it says.

The teacher is what ``eagle3.train.loss.batch_target`` gives: the target's distribution restricted
to the draft vocab and renormalised, exact (full vocab) or from the stored top-k (``fp8_topk``).
What top-k costs LK: the target's mass outside its top-k is unknown; it is treated as zero and the
kept mass renormalised (the same teacher KL gets). So alpha is measured against the truncated
teacher: draft mass spent outside the top-k earns no acceptance and is pushed down, and alpha
over-counts inside the top-k by the missing tail's share (small at k = 256 on a peaked target; with
k = the vocab both teachers are the same, ``tests/unit/train/test_train_objectives.py``).
Restricting to the draft vocab does not move the optimum: ``q = p`` renormalised maximises both the
restricted and the served (unrestricted) acceptance rate.
"""

from __future__ import annotations

import torch

from eagle3.train.distributed import all_reduce_sum

TINY = torch.finfo(torch.float32).tiny


def acceptance(target: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``alpha [B, T] = sum_v min(p_v, q_v)`` from ``target [B, T, V]`` and ``logp [B, T, V]``
    (float32)."""
    return torch.minimum(target, logp.exp()).sum(-1)


def soft_cross_entropy(target: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``-sum_v p_v log q_v`` per position ``[B, T]``."""
    return -(target * logp).sum(-1)


def kl_divergence(target: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``KL(p || q) = sum_v p_v (log p_v - log q_v)`` per position ``[B, T]`` (``0 log 0 = 0``)."""
    return torch.xlogy(target, target).sum(-1) + soft_cross_entropy(target, logp)


@torch.no_grad()
def lambda_weight(
    alpha: torch.Tensor, mask: torch.Tensor, *, kl_scale: float, kl_decay: float
) -> torch.Tensor:
    """``kl_scale * exp(-kl_decay * mean alpha)`` over the masked positions of the global batch (all
    ranks agree, so N ranks compute one process's gradient); a scalar, no gradient."""
    sums = all_reduce_sum(torch.stack([(alpha * mask).sum(), mask.sum()]).float())
    mean = sums[0] / sums[1].clamp(min=1.0)
    return kl_scale * torch.exp(-kl_decay * mean)


def position_loss(
    kind: str,
    target: torch.Tensor,
    logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_scale: float,
    kl_decay: float,
) -> torch.Tensor:
    """The step's loss per position ``[B, T]``, zero where ``mask`` is 0; the caller sums it and
    divides by the global mask count (the per-step normalisation every objective shares)."""
    if kind == "kl":
        return soft_cross_entropy(target, logp) * mask
    alpha = acceptance(target, logp)
    keep = mask > 0
    # masked positions only: a shifted-out position has no teacher (alpha 0, log 0)
    if kind == "lk_alpha":
        return torch.where(keep, -torch.log(alpha.clamp(min=TINY)), torch.zeros_like(alpha))
    if kind == "lk_lambda":
        w = lambda_weight(alpha, mask, kl_scale=kl_scale, kl_decay=kl_decay)
        return (w * kl_divergence(target, logp) + (1 - w) * (1 - alpha)) * mask
    raise ValueError(f"train.loss {kind!r} is not an objective: use kl, lk_alpha or lk_lambda")
