"""Sampling in the reference server: the target's distribution for a request, plain sampling (the
plain engine and a speculative engine's first token), and exact speculative sampling of a drafted
chain, as SGLang 0.5.23 does it.

The distribution (``target_probs``): softmax(logits / temperature), then the ``top_k`` most likely
tokens kept and renormalised, then the smallest prefix of the sorted tokens whose mass reaches
``top_p`` kept and renormalised (SGLang's ``sampling_softmax`` -> ``top_k_renorm_prob`` ->
``top_p_renorm_prob``). A greedy row (temperature below 1e-6 or ``top_k == 1``) is the one-hot of
its argmax, so greedy is the same algorithm with a one-hot distribution.

Verification of a chain (``verify_chain``), SGLang's default kernel
``tree_speculative_sampling_target_only`` for a chain: the draft proposes deterministically (its
argmax: a one-hot proposal distribution q), and with ``p_j`` the target's distribution after the
first ``j`` drafts, draft ``x_j`` is accepted when ``p_j(x_j) > 0`` and (``u_j < p_j(x_j) /
threshold_acc`` or ``p_j(x_j) >= threshold_single``), ``u_j`` a uniform coin. At the first rejection
the next token is drawn from ``p_j`` with ``x_j``'s mass removed and renormalised (``max(p - q, 0)``
normalised, q one-hot); when every draft is accepted the bonus token is drawn from ``p_S``. With
both thresholds at 1.0 (SGLang's defaults) this is exact: each output token has the target's
distribution given the tokens before it, because P(x_j out) = p(x_j) and P(y out) = (1 - p(x_j)) *
p(y) / (1 - p(x_j)) = p(y) for y != x_j. Lower thresholds accept more drafts and are lossy. The
acceptance at a position is ``p_j(x_j)``, so the expected drafts accepted by a pass are ``sum_k
prod_{j<=k} p_j(x_j)`` (``expected_accepted``), computable from the two models alone.

Draws are inverse-CDF from given coins (``sample``), so a row's tokens are a function of its logits
and its coins; the coins come from a per-request ``torch.Generator`` (``RowSampling``): seeded by
the request's ``sampling_seed``, else by the engine's own generator, so a seeded request gives the
same tokens alone or in any batch (up to float rounding of the logits), and a run of seeded requests
is reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from eagle3.serve.reference.protocol import Sequence as Request

GREEDY_EPS = 1e-6  # SGLang's: a temperature below it is greedy


@dataclass
class RowSampling:
    """One row's sampling: its parameters and its coin stream (``generator``; None for greedy rows,
    which draw nothing)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    generator: torch.Generator | None = field(default=None, repr=False)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    def coins(self, n: int) -> torch.Tensor:
        """``n`` uniforms in [0, 1) from this row's stream (zeros for a greedy row: its distribution
        is one-hot)."""
        if self.greedy:
            return torch.zeros(n)
        assert self.generator is not None, "a sampled row needs its generator"
        return torch.rand(n, generator=self.generator)

    @classmethod
    def seeded(cls, temperature: float, top_p: float, top_k: int, seed: int) -> RowSampling:
        """A row whose coins come from ``seed`` (a request's ``sampling_seed``, or one the engine
        drew)."""
        row = cls(temperature, top_p, top_k)
        if not row.greedy:
            row.generator = torch.Generator(device="cpu").manual_seed(seed & (2**63 - 1))
        return row


def _renorm_top_k(
    probs: torch.Tensor, sorted_probs: torch.Tensor, top_k: torch.Tensor
) -> torch.Tensor:
    """Keep each row's ``top_k`` largest (``top_k <= 0``: all), by rank in the sorted order."""
    vocab = probs.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    kth = sorted_probs.gather(-1, (k - 1)[:, None])  # [N, 1] the k-th largest value
    return torch.where(probs >= kth, probs, torch.zeros_like(probs))


def _renorm_top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep each row's smallest most-likely prefix whose mass reaches ``top_p`` (the top token
    always)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the tokens ranked above
    keep_sorted = before < top_p[:, None] * sorted_probs.sum(-1, keepdim=True)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return torch.where(keep, probs, torch.zeros_like(probs))


def target_probs(logits: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
    """The target's distribution for every position of every row: ``logits [B, S, V]`` (or ``[B,
    V]``) -> probs of the same shape, each row with its own parameters (module docstring); greedy
    rows one-hot."""
    flat = logits.float().reshape(len(rows), -1, logits.shape[-1])  # [B, S, V]
    _, positions, vocab = flat.shape
    out = torch.nn.functional.one_hot(flat.argmax(-1), vocab).to(flat.dtype)  # greedy rows
    sampled = [b for b, row in enumerate(rows) if not row.greedy]
    if sampled:
        index = torch.tensor(sampled)
        per = [rows[b] for b in sampled]
        temps = torch.tensor([r.temperature for r in per]).repeat_interleave(positions)
        probs = torch.softmax(flat[index].reshape(-1, vocab) / temps[:, None], dim=-1)  # [N*S, V]
        top_k = torch.tensor([r.top_k for r in per]).repeat_interleave(positions)
        if bool((top_k > 0).any()):
            probs = _renorm_top_k(probs, probs.sort(dim=-1, descending=True).values, top_k)
        top_p = torch.tensor([r.top_p for r in per], dtype=probs.dtype).repeat_interleave(positions)
        if bool((top_p < 1).any()):
            probs = _renorm_top_p(probs, top_p)
        out[index] = (probs / probs.sum(-1, keepdim=True)).reshape(len(sampled), positions, vocab)
    return out.reshape(logits.shape)


def sample(probs: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs [N, V]`` (unnormalised mass is fine) by inverse CDF at ``coins
    [N]``; never a zero-mass token (a coin past the last bucket by rounding takes the last token
    with mass)."""
    cdf = probs.cumsum(-1)
    token = torch.searchsorted(cdf, (coins * cdf[:, -1])[:, None], right=True)[:, 0]
    token = token.clamp(max=probs.shape[-1] - 1)
    stuck = probs.gather(-1, token[:, None])[:, 0] <= 0
    if bool(stuck.any()):
        last = (
            probs.shape[-1] - 1 - (probs.flip(-1) > 0).int().argmax(-1)
        )  # the last token with mass
        token = torch.where(stuck, last, token)
    return token


def row_sampling(seq: Request, generator: torch.Generator) -> RowSampling:
    """The request's sampling state, made once: seeded by its ``sampling_seed``, else by a draw of
    ``generator``."""
    if seq.sampling is None:
        p = seq.params
        seed = p.sampling_seed
        if seed is None and not p.greedy:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        seq.sampling = RowSampling.seeded(p.temperature, p.top_p, p.top_k, seed or 0)
    return seq.sampling


def next_tokens(logits: torch.Tensor, rows: list[RowSampling]) -> list[int]:
    """One token per row of ``logits [B, V]``: argmax for greedy rows, a draw from the target's
    distribution (``sampling.target_probs``) at the row's next coin otherwise."""
    if all(row.greedy for row in rows):
        return logits.argmax(dim=-1).tolist()
    coins = torch.cat([row.coins(1) for row in rows])
    return sample(target_probs(logits, rows), coins).tolist()


class Verified(NamedTuple):
    """A verified chain per row: ``accepted [B]`` drafts kept, ``tokens [B, S + 1]`` (the accepted
    drafts, then the next token at column ``accepted``; later columns are the proposal and unread),
    and ``draft_probs [B, S]``: ``p_j(x_j)``, the target's probability of each draft given the
    drafts before it."""

    accepted: torch.Tensor
    tokens: torch.Tensor
    draft_probs: torch.Tensor


def verify_chain(
    probs: torch.Tensor,
    proposal: torch.Tensor,
    coins: torch.Tensor,
    final_coins: torch.Tensor,
    *,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
) -> Verified:
    """Speculative sampling of a chain (module docstring): ``probs [B, S + 1, V]`` the target's
    distributions after the last token and each draft, ``proposal [B, S]``, ``coins [B, S]`` the
    acceptance coins, ``final_coins [B]`` the coin of the token after the accepted drafts."""
    steps, rows = proposal.shape[1], torch.arange(proposal.shape[0])
    p_draft = probs[:, :steps].gather(-1, proposal[:, :, None])[..., 0]  # [B, S]
    ok = (p_draft > 0) & (
        (coins < p_draft / max(threshold_acc, 1e-9)) | (p_draft >= threshold_single)
    )
    accepted = ok.long().cumprod(1).sum(1)  # [B]
    last = probs[rows, accepted].clone()  # [B, V] the distribution of the next token
    rejected = accepted < steps
    drop = proposal[rows, accepted.clamp(max=steps - 1)]
    last[rows[rejected], drop[rejected]] = 0.0  # the rejected draft's mass removed (q one-hot)
    tokens = torch.cat([proposal, proposal[:, :1]], dim=1)
    tokens[rows, accepted] = sample(last, final_coins)
    return Verified(accepted, tokens, p_draft)


def verify_greedy(logits: torch.Tensor, proposal: torch.Tensor) -> Verified:
    """Greedy verification of ``proposal [B, S]`` against the target's argmax of ``logits [B, S + 1,
    V]``: the sampled algorithm with one-hot target distributions (``draft_probs`` 1 where a draft
    is the argmax, else 0)."""
    steps, rows = proposal.shape[1], torch.arange(proposal.shape[0])
    greedy = logits.argmax(
        -1
    )  # [B, S + 1]: greedy[:, i] is the target's token after proposal[:, :i]
    match = proposal == greedy[:, :steps]
    accepted = match.long().cumprod(1).sum(1)  # [B]
    tokens = torch.cat([proposal, proposal[:, :1]], dim=1)
    tokens[rows, accepted] = greedy[
        rows, accepted
    ]  # row b: proposal[b, :a_b] + [bonus_b], then unread columns
    return Verified(accepted, tokens, match.float())


def expected_accepted(draft_probs: torch.Tensor) -> torch.Tensor:
    """Expected drafts accepted per pass, ``sum_k prod_{j<=k} p_j(x_j)`` over ``draft_probs [B, S]``
    -> ``[B]``."""
    return draft_probs.cumprod(-1).sum(-1)
