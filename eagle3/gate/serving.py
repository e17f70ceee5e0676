"""What the per-level measurement says about serving: the crossover, and SGLang's adaptive
speculation tiers.

Design choices:
- **Crossover.** Speculation pays at small batches and loses at large ones (a verify pass over k+1
  positions costs a batch more than a decode step does). The crossover is the concurrency where a
  draft's speedup falls through 1.0: between two measured levels it is interpolated linearly in (log
  concurrency, log speedup), the scale the levels are spaced on and the one the statistic lives on,
  and it is marked ``interpolated``; the gate never measured there. Only the first fall is placed; a
  speedup that rises above 1 again further up is named. It is placed on the speedup estimates (the
  levels' intervals stand beside it in the report).
- **Adaptive tiers.** SGLang 0.5.23's ``--speculative-adaptive --speculative-adaptive-config FILE``
  (``srt/speculative/adaptive_spec_params.py``): a JSON object whose integer-string keys are batch
  sizes, each ``{"candidate_steps": [...]}``; a running batch uses the tier of the largest key <=
  its size (the first tier below it), SGLang picks among the tier's candidates from the accept
  length it observes, and a step count of 0 turns drafting off. EAGLE/EAGLE3 with topk 1 only: other
  arms are left out. Its tuning knobs (hysteresis, EMA) are left at SGLang's defaults.
- **One tier per measured level**, covering the batch sizes nearer to it than to its neighbours on
  the log scale: the first starts at 1, the next at ``ceil(sqrt(c_i * c_(i+1)))``. Each tier's
  candidates, from the draft's arms (one per ``gate.sweep`` setting) at that level: the fastest
  arm's step count when its interval is above 1 (shown faster); ``[0, steps]`` when it is faster on
  the estimate only (SGLang keeps it on while drafts are accepted, and may turn it off); ``[0]``
  when no arm's estimate reaches 1 there.
- The server starts at ``--speculative-num-steps`` = the first tier's best step count (SGLang
  requires it among the candidates). When every tier is ``[0]`` there is nothing to adapt: the
  recommendation is the baseline.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Crossover:
    """Where speculation stops paying: ``concurrency`` None when no level crossed 1.0 (``summary``
    says why)."""

    concurrency: float | None
    interpolated: bool
    between: list[int] | None
    summary: str


def _x(speedup: float) -> str:
    return f"{speedup:.2f}x"


def crossover(points: Sequence[tuple[int, float]]) -> Crossover:
    """The crossover of ``(concurrency, speedup)`` points (module docstring), any order."""
    points = sorted(points)
    if not points:
        return Crossover(None, False, None, "no level measured: no crossover")
    span = f"{points[0][0]}..{points[-1][0]}" if len(points) > 1 else f"{points[0][0]} only"
    fall = next((i for i in range(len(points)) if points[i][1] < 1.0), None)
    if fall is None:
        return Crossover(
            None,
            False,
            None,
            f"speedup >= 1 at every measured level ({span}): no crossover "
            f"measured, above {points[-1][0]} unknown",
        )
    if fall == 0:
        return Crossover(
            None,
            False,
            None,
            f"speedup below 1 from the first measured level ({span}): speculation pays at none",
        )
    (a, sa), (b, sb) = points[fall - 1], points[fall]
    again = next((c for c, s in points[fall + 1 :] if s >= 1.0), None)
    tail = f"; faster again at concurrency {again}" if again is not None else ""
    if sa == 1.0:
        return Crossover(
            float(a),
            False,
            [a, a],
            f"speculation stops paying at concurrency {a} (measured "
            f"{_x(sa)}; {_x(sb)} at {b}){tail}",
        )
    t = math.log(sa) / (math.log(sa) - math.log(sb))  # in (0, 1): log sa > 0 > log sb
    at = math.exp(math.log(a) + t * (math.log(b) - math.log(a)))
    return Crossover(
        at,
        True,
        [a, b],
        f"speculation stops paying at concurrency ~{at:.1f} (interpolated on log "
        f"concurrency between {a} at {_x(sa)} and {b} at {_x(sb)}){tail}",
    )


@dataclass(frozen=True)
class StepResult:
    """One arm of the draft at one level: its step count, speedup over the baseline and its interval
    (or None)."""

    steps: int
    speedup: float
    interval: list[float] | None


@dataclass(frozen=True)
class Tier:
    """One SGLang tier: from ``batch_size`` up, ``candidate_steps``; ``concurrency`` is the level it
    comes from."""

    batch_size: int
    concurrency: int
    candidate_steps: list[int]
    reason: str


def _tier_starts(levels: Sequence[int]) -> list[int]:
    """Each level's tier start: 1, then the rounded-up geometric midpoints between neighbours."""
    return [1] + [math.ceil(math.sqrt(lo * hi)) for lo, hi in itertools.pairwise(levels)]


def _candidates(c: int, arms: Sequence[StepResult]) -> tuple[list[int], str]:
    best = max(arms, key=lambda a: a.speedup)
    shown = "" if best.interval is None else f" [{best.interval[0]:.2f}, {best.interval[1]:.2f}]"
    measured = f"concurrency {c}: best {best.steps} steps at {_x(best.speedup)}{shown}"
    if best.speedup < 1.0:
        shown = best.interval is not None and best.interval[1] < 1.0
        return [
            0
        ], f"{measured}, {'slower' if shown else 'no faster'} than the baseline: drafting off"
    if best.interval is not None and best.interval[0] > 1.0:
        return [best.steps], f"{measured}, shown faster: {best.steps} steps"
    return [
        0,
        best.steps,
    ], f"{measured}, not shown faster: {best.steps} steps, SGLang may turn drafting off"


def adaptive_tiers(levels: Mapping[int, Sequence[StepResult]]) -> list[Tier]:
    """One tier per level that has a measured arm (module docstring), ascending."""
    measured = sorted(c for c, arms in levels.items() if arms)
    tiers = []
    for start, c in zip(_tier_starts(measured), measured, strict=True):
        steps, reason = _candidates(c, levels[c])
        tiers.append(Tier(start, c, steps, reason))
    return tiers


def sglang_config(tiers: Sequence[Tier]) -> dict[str, dict[str, list[int]]]:
    """The ``--speculative-adaptive-config`` JSON object of ``tiers``."""
    return {str(t.batch_size): {"candidate_steps": list(t.candidate_steps)} for t in tiers}


def initial_steps(tiers: Sequence[Tier]) -> int | None:
    """``--speculative-num-steps`` for the adaptive server: the largest step count of the first tier
    that drafts; None when every tier is off (nothing to adapt)."""
    for tier in tiers:
        if max(tier.candidate_steps) > 0:
            return max(tier.candidate_steps)
    return None
