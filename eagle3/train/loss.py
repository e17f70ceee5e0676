"""Training-time-test objective: the draft unrolled ``ttt_steps`` times against the frozen target's
distribution.

Indexing (SGLang's): position ``t`` holds the target's aux hidden of token ``t``. At unrolled step
``k`` the chain at ``t`` reads token ``t+1+k`` (the input ids shifted left by ``1+k``; at ``k=0``
the token the target emitted after ``t``), and predicts token ``t+2+k``, whose target distribution
is ``softmax(lm_head(last_hidden[t+1+k]))`` restricted to the draft vocab and renormalized (features
in the ``fp8_topk`` encoding carry the target's top-k of that softmax instead, restricted and
renormalized the same way: ``batch_target``). So "step k predicts the token k+1 beyond the one it
reads".

Mask at step k, position t: ``loss_mask[t+2+k]`` (the predicted token is an assistant token) AND the
target's argmax at ``t+1+k`` lies in the draft vocab AND the position is not padding; shifted-out
positions are masked. Per-step loss: ``train.loss`` per position (``eagle3.train.objectives``: soft
cross-entropy ``-sum_v p_target(v) log p_draft(v)`` by default, or an LK acceptance-rate objective)
averaged over masked positions of the *global* batch (the trainer passes all-reduced counts, so N
ranks compute the same gradient as one process with the same global batch); total loss ``sum_k
decay^k loss_k``. The unroll lives in an ``nn.Module`` so DDP/FSDP see a single forward per
backward; the frozen embedding is an argument, never a (broadcast) buffer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eagle3.capture.head import head_logits
from eagle3.config.train import LossKind
from eagle3.model.draft import DraftModel, TTTCache
from eagle3.train.identity import DraftInputs
from eagle3.train.objectives import position_loss


def shift_left(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x[:, t] <- x[:, t+n]`` along dim 1, zero-filled at the end (``[B, T, ...]`` -> same
    shape)."""
    if n == 0:
        return x
    out = torch.zeros_like(x)
    if n < x.shape[1]:
        out[:, : x.shape[1] - n] = x[:, n:]
    return out


@torch.no_grad()
def target_distribution(
    last_hidden: torch.Tensor, lm_head: torch.Tensor, draft_ids: torch.Tensor, *, chunk: int = 2048
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target probabilities over the draft vocab and whether the full-vocab argmax is in it.

    ``last_hidden [B, T, H]`` (post-norm), ``lm_head [V, H]``, ``draft_ids [V_d]`` (target id of
    each draft id). Returns ``probs [B, T, V_d]`` float32 (renormalized over the draft vocab) and
    ``in_vocab [B, T]`` bool. Full-vocab logits come from ``eagle3.capture.head`` (the path the
    ``fp8_topk`` capture takes), chunked.
    """
    b, t, _ = last_hidden.shape
    in_draft = torch.zeros(lm_head.shape[0], dtype=torch.bool, device=draft_ids.device)
    in_draft[draft_ids] = True
    probs, in_vocab = [], []
    for logits in head_logits(last_hidden, lm_head, chunk=chunk):  # [n, V] each
        in_vocab.append(in_draft[logits.argmax(-1)])
        probs.append(torch.softmax(logits[:, draft_ids].float(), dim=-1))  # [n, V_d], renormalized
    return torch.cat(probs).view(b, t, -1), torch.cat(in_vocab).view(b, t)


@torch.no_grad()
def topk_distribution(
    ids: torch.Tensor, probs: torch.Tensor, draft_ids: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``target_distribution``'s result from the target's stored top-k (the ``fp8_topk`` encoding).

    ``ids, probs [B, T, k]`` (target ids by descending probability, ``ids[..., 0]`` the argmax;
    padding has probability 0), ``draft_ids [V_d]``, ``vocab_size`` the target's. Ids outside the
    draft vocab are dropped and the rest renormalized, as ``target_distribution`` renormalizes over
    the draft vocab; ``in_vocab`` is the top-1 id in the draft vocab. With ``k`` = the target vocab
    both give the same distribution (up to float16 rounding).
    """
    b, t, _ = ids.shape
    to_draft = torch.full((vocab_size,), -1, dtype=torch.long, device=ids.device)
    to_draft[draft_ids] = torch.arange(len(draft_ids), device=ids.device)
    slots = to_draft[ids.long()]  # [B, T, k] draft id or -1
    kept = probs.float() * (slots >= 0)
    dense = torch.zeros(b, t, len(draft_ids), device=ids.device).scatter_add_(
        -1, slots.clamp(min=0), kept
    )
    # [B, T, V_d]
    dense = dense / dense.sum(-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)
    return dense, slots[..., 0] >= 0


def batch_target(
    batch: dict[str, torch.Tensor], lm_head: torch.Tensor, draft_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target distribution over the draft vocab and ``in_vocab`` of a batch, on ``lm_head``'s
    device, from what it carries: the stored top-k (``target_ids``/``target_probs``, encoding
    ``fp8_topk``) or the final state (``last_hidden``). The objective takes the distribution however
    it was obtained."""
    device = lm_head.device
    if "target_ids" in batch:
        return topk_distribution(
            batch["target_ids"].to(device),
            batch["target_probs"].to(device),
            draft_ids.to(device),
            lm_head.shape[0],
        )
    return target_distribution(batch["last_hidden"].to(device), lm_head, draft_ids.to(device))


def step_masks(
    loss_mask: torch.Tensor, attention_mask: torch.Tensor, in_vocab: torch.Tensor, steps: int
) -> torch.Tensor:
    """``[K, B, T]`` float masks, step k: ``loss_mask[t+2+k] & attention_mask[t+2+k] &
    in_vocab[t+1+k]``."""
    valid = loss_mask.bool() & attention_mask.bool()
    return torch.stack(
        [(shift_left(valid, 2 + k) & shift_left(in_vocab, 1 + k)).float() for k in range(steps)]
    )


def prepare_batch(
    batch: dict[str, torch.Tensor], inputs: DraftInputs, steps: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch as the objective reads it (``inputs`` already on ``device``): input ids, aux
    states, the target distribution over the draft vocab, the per-step masks and the attention
    mask."""
    ids = batch["input_ids"].to(device).long()
    aux = batch["aux_hidden"].to(device).float()
    attn = batch["attention_mask"].to(device).bool()
    probs, in_vocab = batch_target(batch, inputs.head.lm_head, inputs.draft_ids)
    masks = step_masks(batch["loss_mask"].to(device), attn, in_vocab, steps)
    return ids, aux, probs, masks, attn


class TTTObjective(nn.Module):
    """Wraps the draft; ``forward`` runs the whole unroll and returns the weighted loss and per-step
    stats."""

    def __init__(
        self,
        draft: DraftModel,
        *,
        steps: int,
        decay: float,
        loss: LossKind = "kl",
        kl_scale: float = 1.0,
        kl_decay: float = 3.0,
    ) -> None:
        super().__init__()
        self.draft = draft
        self.steps = steps
        self.decay = decay
        self.loss, self.kl_scale, self.kl_decay = loss, kl_scale, kl_decay

    def forward(
        self,
        input_ids: torch.Tensor,
        aux_hidden: torch.Tensor,
        embed_weight: torch.Tensor,
        target_probs: torch.Tensor,
        masks: torch.Tensor,
        denominators: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted TTT loss and stats ``[K, 3]`` = (loss sum, correct count, mask count) per step
        (local).

        ``input_ids [B, T]``, ``aux_hidden [B, T, 3H]``, ``embed_weight [V, H]`` (frozen),
        ``target_probs [B, T, V_d]`` (unshifted), ``masks [K, B, T]`` from ``step_masks``,
        ``denominators [K]`` = global mask counts / world size (at least 1 each).
        """
        b, t = input_ids.shape
        positions = torch.arange(t, device=input_ids.device).expand(b, t)  # [B, T]
        cache = TTTCache()
        hidden = aux_hidden
        total = aux_hidden.new_zeros((), dtype=torch.float32)
        stats = []
        for k in range(self.steps):
            # [B, T, H]
            embeds = F.embedding(shift_left(input_ids, 1 + k), embed_weight).to(aux_hidden.dtype)
            # [B, T, V_d], [B, T, H]
            logits, hidden = self.draft(embeds, hidden, positions + k, cache)
            logp = torch.log_softmax(logits.float(), dim=-1)
            target = shift_left(target_probs, 1 + k)  # [B, T, V_d]
            per_position = position_loss(
                self.loss, target, logp, masks[k], kl_scale=self.kl_scale, kl_decay=self.kl_decay
            )  # [B, T], zero off the mask
            loss_sum = per_position.sum()
            total = total + (self.decay**k) * loss_sum / denominators[k]
            with torch.no_grad():
                correct = ((logits.argmax(-1) == target.argmax(-1)).float() * masks[k]).sum()
                stats.append(torch.stack([loss_sum.detach(), correct, masks[k].sum()]))
        return total, torch.stack(stats)


def accept_length(accuracies: list[float]) -> float:
    """Simulated chain accept length ``1 + sum_k prod_{j<=k} acc_j`` from per-step accuracies."""
    length, running = 1.0, 1.0
    for acc in accuracies:
        running *= acc
        length += running
    return length
