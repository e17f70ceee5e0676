"""Exact speculative sampling (``eagle3.serve.reference.sampling``), proven by statistics on a world
small enough to enumerate: the first K tokens that chain speculation with sampled verification
outputs have the distribution of plain sampling from the target, and the same test fails for planted
bugs.

The world: a target and a draft given as logit tables over every prefix (vocab V), the draft
proposing its argmax (one-hot, as EAGLE drafts). The exact distribution of the first K tokens is the
product of the target's conditionals, enumerated over all V**K sequences; N seeded runs of the
speculative loop are compared with it by a chi-square goodness-of-fit test (cells with an expected
count below 5 pooled) at significance ALPHA. Power: a planted bug's run gives the non-centrality
lambda ~ X2 - df, and the probability that a run of the bug passes is the normal approximation of
the non-central chi-square at the critical value; each bug's test asserts that power, so a weaker
test (fewer samples, a milder bug) is a failure too. At N = 10,000 and ~85 pooled cells the test
detects with power 0.999 any error whose chi-square distance sum (p_bug - p)^2 / p exceeds ~0.014
(lambda ~140); the planted bugs measure lambda 850 to 10,000. Every coin comes from a fixed seed:
the tests never flake, and ALPHA is what a correct sampler would risk with fresh seeds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import pytest
import torch

from eagle3.serve.reference.sampling import (
    RowSampling,
    expected_accepted,
    sample,
    target_probs,
    verify_chain,
    verify_greedy,
)

V, K, S = 5, 3, 2  # vocab, output tokens compared, drafts per verify pass
N = 10_000  # seeded runs of the speculative loop per test
ALPHA = 1e-4
Z_ALPHA = 3.719  # the standard normal's 1 - ALPHA quantile
MIN_POWER = 0.999

Verify = Callable[..., object]


class Table:
    """A model's logits for every prefix of up to ``depth`` tokens, seeded; ``scale`` sets how
    peaked it is (or, ``like`` another table, how far from it)."""

    def __init__(
        self, seed: int, scale: float, like: Table | None = None, depth: int = K - 1 + S
    ) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.offsets = [sum(V**i for i in range(n)) for n in range(depth + 2)]
        self.logits = torch.randn(self.offsets[-1], V, generator=gen) * scale
        if like is not None:  # a draft that learned the target, with errors of size ``scale``
            self.logits += like.logits

    def __call__(self, prefix: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, V]`` after each row's first ``length`` tokens of ``prefix [N, width]``."""
        powers = V ** torch.arange(prefix.shape[1])
        used = torch.arange(prefix.shape[1])[None] < length[:, None]
        code = (prefix * powers * used).sum(1)
        return self.logits[torch.tensor(self.offsets)[length] + code]


TARGET = Table(seed=1, scale=1.5)
DRAFT = Table(seed=2, scale=1.0, like=TARGET)
SAMPLINGS = {
    "T=1": RowSampling(1.0),
    "T=0.7 top_p=0.9 top_k=4": RowSampling(0.7, 0.9, 4),
}


def _probs(logits: torch.Tensor, sampling: RowSampling) -> torch.Tensor:
    return target_probs(logits[:, None], [sampling] * logits.shape[0])[:, 0]


def exact_distribution(sampling: RowSampling) -> torch.Tensor:
    """P(first K tokens) under plain sampling from the target, over the V**K sequences (token i is
    digit i)."""
    seqs = torch.cartesian_prod(*[torch.arange(V)] * K)  # [V**K, K], lexicographic: the code below
    prob = torch.ones(seqs.shape[0])
    for i in range(K):
        probs = _probs(TARGET(seqs, torch.full((seqs.shape[0],), i)), sampling)
        prob = prob * probs.gather(1, seqs[:, i : i + 1])[:, 0]
    return prob


def _correct(probs, proposal, coins, final, q_soft):
    return verify_chain(probs, proposal, coins, final)


def _min_p_over_q(probs, proposal, coins, final, q_soft):
    """Planted bug: classic rejection sampling (accept with min(1, p/q), residual max(p - q, 0))
    with the draft's softmax q, while the draft proposes its argmax (its real proposal distribution
    is one-hot)."""
    steps, rows = proposal.shape[1], torch.arange(proposal.shape[0])
    p = probs[:, :steps].gather(-1, proposal[..., None])[..., 0]
    q = q_soft.gather(-1, proposal[..., None])[..., 0]
    accepted = (coins < (p / q).clamp(max=1)).long().cumprod(1).sum(1)
    last = probs[rows, accepted].clone()
    rejected = accepted < steps
    residual = (probs[rows, accepted] - q_soft[rows, accepted.clamp(max=steps - 1)]).clamp(min=0)
    last[rejected] = residual[rejected]
    tokens = torch.cat([proposal, proposal[:, :1]], dim=1)
    tokens[rows, accepted] = sample(last, final)
    return tokens, accepted


def _residual_keeps_rejected(probs, proposal, coins, final, q_soft):
    """Planted bug: the token after a rejection drawn from p itself, the rejected draft's mass not
    removed."""
    steps, rows = proposal.shape[1], torch.arange(proposal.shape[0])
    p = probs[:, :steps].gather(-1, proposal[..., None])[..., 0]
    accepted = (coins < p).long().cumprod(1).sum(1)
    tokens = torch.cat([proposal, proposal[:, :1]], dim=1)
    tokens[rows, accepted] = sample(probs[rows, accepted], final)
    return tokens, accepted


def _lossy_threshold(probs, proposal, coins, final, q_soft):
    """Not a bug but SGLang's lossy option: ``--speculative-accept-threshold-acc 0.8`` accepts more
    drafts."""
    return verify_chain(probs, proposal, coins, final, threshold_acc=0.8)


@functools.cache
def speculate(name: str, verify: Verify, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """N runs of chain speculation on the world at ``SAMPLINGS[name]``: (their first K tokens ``[N,
    K]``, drafts accepted by each run's first verify pass ``[N]``). Runs with K tokens stop; the
    others take another pass."""
    sampling = SAMPLINGS[name]
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(N, K + S + 1, dtype=torch.long)
    start = _probs(TARGET(tokens, torch.zeros(N, dtype=torch.long)), sampling)
    tokens[:, 0] = sample(start, torch.rand(N, generator=gen))
    length = torch.ones(N, dtype=torch.long)
    first_pass = torch.full((N,), -1)
    while bool((length < K).any()):
        live = (length < K).nonzero()[:, 0]
        rows, at = torch.arange(len(live)), length[live]
        context, proposal, q_soft = tokens[live].clone(), [], []
        for j in range(
            S
        ):  # the draft's chain: its argmax after the accepted tokens and its own drafts
            logits = DRAFT(context, at + j)
            q_soft.append(torch.softmax(logits, -1))
            proposal.append(logits.argmax(-1))
            context[rows, at + j] = proposal[-1]
        probs = torch.stack(
            [_probs(TARGET(context, at + j), sampling) for j in range(S + 1)], dim=1
        )
        coins = torch.rand(len(live), S + 1, generator=gen)
        out = verify(
            probs, torch.stack(proposal, 1), coins[:, :S], coins[:, S], torch.stack(q_soft, 1)
        )
        new, accepted = (out.tokens, out.accepted) if hasattr(out, "tokens") else out
        for i in range(S + 1):
            write = i <= accepted
            tokens[live[write], (at + i)[write]] = new[write, i]
        first_pass[live] = torch.where(first_pass[live] < 0, accepted, first_pass[live])
        length[live] = at + accepted + 1
    return tokens[:, :K], first_pass


def chi_square(observed: torch.Tensor, expected_p: torch.Tensor) -> tuple[float, int, float]:
    """(X2, df, critical value at ALPHA) of counts over the V**K cells; cells expecting < 5 pooled
    into one."""
    counts = torch.bincount(observed @ (V ** torch.arange(K - 1, -1, -1)), minlength=V**K).double()
    expected = expected_p.double() * observed.shape[0]
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    x2 = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    df = int(keep.sum()) - 1
    critical = df * (1 - 2 / (9 * df) + Z_ALPHA * math.sqrt(2 / (9 * df))) ** 3  # Wilson-Hilferty
    return x2, df, critical


def power(x2: float, df: int, critical: float) -> float:
    """P(a fresh run of the same bug exceeds ``critical``): non-central chi-square with lambda = X2
    - df, by its normal approximation (mean df + lambda, variance 2(df + 2 lambda))."""
    lam = max(x2 - df, 0.0)
    z = (critical - df - lam) / math.sqrt(2 * (df + 2 * lam))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_speculative_sampling_outputs_the_targets_distribution(name):
    sampling = SAMPLINGS[name]
    tokens, _ = speculate(name, _correct)
    x2, df, critical = chi_square(tokens, exact_distribution(sampling))
    assert x2 < critical, (
        f"{name}: X2 {x2:.1f} over {df} df, critical {critical:.1f} at alpha {ALPHA}"
    )


@pytest.mark.parametrize(
    "bug",
    [_min_p_over_q, _residual_keeps_rejected, _lossy_threshold],
    ids=["min_p_over_q", "residual", "lossy"],
)
@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_the_same_test_fails_for_a_planted_bug_with_the_stated_power(name, bug):
    sampling = SAMPLINGS[name]
    tokens, _ = speculate(name, bug)
    x2, df, critical = chi_square(tokens, exact_distribution(sampling))
    assert x2 > critical, (
        f"{bug.__name__} passed: X2 {x2:.1f} over {df} df, critical {critical:.1f}"
    )
    assert power(x2, df, critical) >= MIN_POWER


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_measured_acceptance_per_position_equals_the_expected_from_the_two_models(name):
    """In the first verify pass the context is one sampled token t; draft j is accepted with
    probability prod_{i<=j} p(x_i | t, x_<i) (the target's probability of the draft's argmax), so
    P(at least j accepted) is that product averaged over t ~ p: computed here from the two tables,
    measured by the runs, within 4.5 binomial standard errors."""
    sampling = SAMPLINGS[name]
    _, accepted = speculate(name, _correct)
    t = torch.arange(V)
    context = torch.zeros(V, K + S, dtype=torch.long)
    context[:, 0] = t
    weight = _probs(TARGET(context, torch.zeros(V, dtype=torch.long)), sampling)[
        0
    ]  # p(t), the first token
    reach = torch.ones(V)
    for j in range(S):
        length = torch.full((V,), 1 + j)
        draft = DRAFT(context, length).argmax(-1)
        reach = reach * _probs(TARGET(context, length), sampling).gather(1, draft[:, None])[:, 0]
        context[:, 1 + j] = draft
        expected = float((weight * reach).sum())
        measured = float((accepted > j).double().mean())
        se = math.sqrt(expected * (1 - expected) / N)
        assert 0.05 < expected < 0.95  # the world exercises both outcomes at every position
        assert abs(measured - expected) < 4.5 * se, (
            f"position {j + 1}: {measured:.4f} vs {expected:.4f}"
        )
    assert float(expected_accepted(torch.ones(1, S))[0]) == S


def test_greedy_rows_are_the_sampled_algorithm_with_one_hot_distributions():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, S + 1, V, generator=gen)
    guess = torch.randint(V, (64, S), generator=gen)
    proposal = torch.where(torch.rand(64, S, generator=gen) < 0.6, logits[:, :S].argmax(-1), guess)
    greedy = verify_greedy(logits, proposal)
    coins = torch.rand(64, S + 1, generator=gen)
    one_hot = target_probs(logits, [RowSampling(0.0)] * 64)
    sampled = verify_chain(one_hot, proposal, coins[:, :S], coins[:, S])
    assert torch.equal(greedy.accepted, sampled.accepted)
    for b in range(64):
        a = int(greedy.accepted[b])
        assert greedy.tokens[b, : a + 1].tolist() == sampled.tokens[b, : a + 1].tolist()
    assert 0 < int(greedy.accepted.sum()) < 64 * S


def test_the_distribution_is_softmax_then_top_k_then_top_p_each_renormalised():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    assert torch.allclose(
        target_probs(logits, [RowSampling(1.0)]), torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    )
    assert torch.allclose(
        target_probs(logits, [RowSampling(1.0, top_k=2)]), torch.tensor([[4 / 7, 3 / 7, 0, 0]])
    )
    # top_p 0.6 after top_k 3: the renormalised (4/9, 3/9, 2/9) needs the first two to reach 0.6
    both = target_probs(logits, [RowSampling(1.0, top_p=0.6, top_k=3)])
    assert torch.allclose(both, torch.tensor([[4 / 7, 3 / 7, 0, 0]]))
    assert torch.allclose(
        target_probs(logits, [RowSampling(1.0, top_p=0.3)]), torch.tensor([[1.0, 0, 0, 0]])
    )
    hot = target_probs(logits * 1.0, [RowSampling(0.5)])
    assert torch.allclose(hot, torch.tensor([[16, 9, 4, 1]]) / 30.0)
    assert torch.equal(target_probs(logits, [RowSampling(0.0)]), torch.tensor([[1.0, 0, 0, 0]]))


def test_inverse_cdf_draws_never_a_zero_mass_token():
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0]] * 3)
    assert sample(probs, torch.tensor([0.0, 0.5, 1.0 - 2**-24])).tolist() == [1, 2, 2]
    assert sample(probs[:1] * 1e-3, torch.tensor([0.999999])).tolist() == [2]


def test_seeded_rows_draw_the_same_coins_and_greedy_rows_draw_none():
    a, b = RowSampling.seeded(1.0, 1.0, -1, 7), RowSampling.seeded(1.0, 1.0, -1, 7)
    other = RowSampling.seeded(1.0, 1.0, -1, 8)
    assert torch.equal(a.coins(4), b.coins(4)) and not torch.equal(a.coins(4), other.coins(4))
    greedy = RowSampling.seeded(0.0, 1.0, -1, 7)
    assert greedy.generator is None and torch.equal(greedy.coins(3), torch.zeros(3))
