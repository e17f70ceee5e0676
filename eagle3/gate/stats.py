"""The gate's statistic: a Student-t confidence interval on the mean log of paired per-round ratios.

Why t on logs, not a bootstrap:
- A gate decides after 3 to 10 rounds. A percentile bootstrap of n values has at most n**n distinct
  resamples and its interval undercovers badly below ~15 values (it never reaches beyond the
  observed extremes); the t interval is exact when the log ratios are normal and degrades gently
  when they are not.
- Logs make the statistic symmetric: a 1.25x speedup and a 0.8x slowdown are the same distance from
  1, and the back-transformed interval bounds the geometric mean ratio, which multiplies like
  speedups do.
- Pairing per round (candidate and baseline measured back to back in one round) removes drift that
  both arms see: only what differs between the two arms within a round widens the interval.

A served-load profile (``gate.traffic``: levels with shares w_c) is combined per round, not per
level: every level is measured in every round (``eagle3.gate.rounds``), so round r has a paired log
speedup x_{c,r} at each level and one weighted log speedup y_r = sum_c w_c x_{c,r}; the interval is
the same t interval over the y_r (n - 1 degrees of freedom). Its centre is the weighted mean of the
levels' log speedups (mean_r y_r = sum_c w_c mean_r x_{c,r}), so the estimate is the weighted
geometric mean of the levels' speedups; its variance is the sample variance of the y_r, which
includes the covariance of the levels measured in the same round (a machine slower during a round
slows every level of it), where combining per-level intervals as independent (sum_c w_c^2 s_c^2 / n
with a Satterthwaite df) would assume it away. A level with no weight plays no part; a round missing
a weighed level is left out. The weighted geometric mean is the symmetric summary of ratios; it lies
between the weighted harmonic mean (the time a token mix with those shares saves) and the arithmetic
mean, and the verdict's per-level floor (``gate.level_weight_floor``) keeps a heavy level's loss
from hiding under the others' gains.

The t quantile is computed here (bisection on the regularized incomplete beta, Numerical Recipes'
``betacf`` continued fraction) because scipy is not a dependency; tests check it against table
values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_EPS = 1e-14
_MAX_ITER = 300


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
    h = d
    for m in range(1, _MAX_ITER):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
            c = 1.0 + aa / c
            c = c if abs(c) > 1e-300 else 1e-300
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t (0 < p < 1), by bisection on ``t_cdf`` to 1e-10."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    while hi - lo > 1e-10:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Interval:
    """Geometric mean ratio over ``n`` rounds and its two-sided ``confidence`` interval [lo, hi]."""

    estimate: float
    lo: float
    hi: float
    n: int
    confidence: float

    def to_list(self) -> list[float]:
        return [self.lo, self.hi]

    def __str__(self) -> str:
        return f"{self.estimate:.3f} [{self.lo:.3f}, {self.hi:.3f}] ({self.confidence:.0%}, {self.n} rounds)"


def ratio_interval(ratios: Sequence[float], confidence: float) -> Interval | None:
    """The t interval of the geometric mean of positive per-round ratios; None below 2 rounds (no
    spread known).

    Rounds that agree exactly (zero spread) give a zero-width interval: the data show no noise to
    widen it.
    """
    if len(ratios) < 2:
        return None
    if any(r <= 0 or not math.isfinite(r) for r in ratios):
        raise ValueError(f"ratios must be positive and finite, got {list(ratios)}")
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, confidence)


def weighted_log_ratios(
    levels: Mapping[int, Mapping[int, float]], shares: Mapping[int, float]
) -> list[float]:
    """Per round (ascending), ``sum_c shares[c] * log(levels[c][round])`` over the levels with a
    share; only rounds where every such level has a ratio (see the module docstring)."""
    weighed = {c: w for c, w in shares.items() if w > 0}
    if not weighed:
        raise ValueError(f"no level has a share: {dict(shares)}")
    rounds = set.intersection(*(set(levels.get(c, {})) for c in weighed))
    out = []
    for r in sorted(rounds):
        ratios = [levels[c][r] for c in weighed]
        if any(x <= 0 or not math.isfinite(x) for x in ratios):
            raise ValueError(f"ratios must be positive and finite, got {ratios} in round {r}")
        out.append(sum(w * math.log(levels[c][r]) for c, w in weighed.items()))
    return out


def weighted_interval(
    levels: Mapping[int, Mapping[int, float]], shares: Mapping[int, float], confidence: float
) -> Interval | None:
    """The t interval of the profile's weighted geometric mean speedup (module docstring); None
    below 2 rounds."""
    return ratio_interval([math.exp(y) for y in weighted_log_ratios(levels, shares)], confidence)
