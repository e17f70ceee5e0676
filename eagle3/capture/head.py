"""The target's next-token distribution from its final (post-norm) state: one ``lm_head`` path for
capture and training.

The final state a capture backend returns is the *input of* ``lm_head`` (``eagle3.capture.hf``), so
the target's logits are ``last @ lm_head.T``: no final norm to re-apply. Training turns a stored
final state into its draft-vocab target with these logits
(``eagle3.train.loss.target_distribution``); the ``fp8_topk`` encoding stores their top-k instead
(``target_topk``), computed here at capture by the same function, so the two encodings train on the
same numbers up to the discarded tail and float16 rounding. Logits are computed ``chunk`` tokens at
a time: full-vocab logits of a long row are ``T x 163K`` floats for Kimi.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def head_logits(
    last: torch.Tensor, lm_head: torch.Tensor, *, chunk: int = 2048
) -> Iterator[torch.Tensor]:
    """Full-vocab logits of ``last [..., H]`` flattened to tokens, ``chunk`` tokens at a time: ``[n,
    V]`` each, in ``lm_head``'s dtype (``lm_head [V, H]``)."""
    flat = last.reshape(-1, last.shape[-1])
    for start in range(0, flat.shape[0], chunk):
        # [n, V]
        yield flat[start : start + chunk].to(device=lm_head.device, dtype=lm_head.dtype) @ lm_head.T


@torch.no_grad()
def target_topk(
    last: torch.Tensor, lm_head: torch.Tensor, k: int, *, chunk: int = 2048
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's ``k`` most likely next tokens after each position of ``last [..., H]``: ``ids
    [..., k]`` int64 and full-vocab softmax ``probs [..., k]`` float32, by descending probability
    (``ids[..., 0]`` is the argmax)."""
    if not 1 <= k <= lm_head.shape[0]:
        raise ValueError(
            f"top-k of k={k} over a {lm_head.shape[0]}-token vocab: set capture.topk in [1, vocab]"
        )
    ids, probs = [], []
    for logits in head_logits(last, lm_head, chunk=chunk):
        top = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)  # [n, V] -> [n, k], sorted
        ids.append(top.indices)
        probs.append(top.values)
    shape = (*last.shape[:-1], k)
    return torch.cat(ids).view(shape), torch.cat(probs).view(shape)
