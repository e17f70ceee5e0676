"""The gate's verdict: a pure function of the arms' measured rounds and ``GateConfig``
(docs/DESIGN.md, "The gate").

Per candidate draft, on the served-load profile ``gate.traffic`` (levels with shares), with its best
spec config (the highest weighted speedup estimate):

- **Statistic** (``eagle3.gate.stats``): at each level, the per-round paired speedups ``candidate
  tok/s / baseline tok/s`` of the same round (measured back to back) and their t interval at
  ``gate.confidence``: the level's own verdict (``LevelVerdict``: against ``min_speedup``, and
  ``slower`` when its interval lies below 1). Over the profile, the t interval of the per-round
  weighted log speedups (the weighted geometric mean of the levels' speedups; the stats module says
  why per round). The same for the gain over the champion when one exists.
- **Sanity checks** (``sanity_checks``, at every weighed level); any failure makes the verdict
  INCONCLUSIVE with its reason, whatever the interval says, because it shows the arms did not see
  the same machine or did not do the same work: ``accept_bound``
  (``eagle3.gate.report_md.PHYSICAL_BOUND``: no round's speedup above its accept length, with
  tolerance), ``baseline_drift`` (the baseline's own rounds agree within
  ``gate.max_baseline_drift``) and ``same_tokens`` (every arm generated as many tokens as the
  baseline in each round, within ``gate.max_token_mismatch``; at a sampling profile the arms draw
  different samples of the same distribution, so their tokens over all rounds must agree within that
  or 4 standard deviations of the difference of two such draws, whichever is wider:
  ``sampled_tokens``).
- **Verdict**: FAIL when the draft was refused or not measured, its accept length (pooled over every
  level) is below ``min_accept``, a weighted upper bound is below its threshold, or a level carrying
  at least ``gate.level_weight_floor`` of the traffic is significantly slower than the baseline (its
  interval below 1: a loss the user serves often, whatever the other levels gain); PASS when every
  check holds and each weighted lower bound clears its threshold (``min_speedup``, and
  ``min_gain_over_champion`` when a champion exists); INCONCLUSIVE otherwise. A lighter level
  significantly slower is a warning of the decision, not a reason. Before ``gate.max_rounds`` an
  open interval (or a PASS: see ``undecided``) means "measure another round".

Noise that slows one arm by the same amount in every measured round cannot be told from a real
difference by any statistic; the checks catch it when it exceeds the physical bound or does not last
the whole measurement. That is why a PASS needs all ``gate.max_rounds`` rounds: to promote a slow
draft, noise must cover the whole measurement. Symmetric noise (both arms slowed in the same rounds)
cancels in the paired ratios, but a baseline that moves more than ``gate.max_baseline_drift`` is
INCONCLUSIVE even so: such a machine is too unstable to certify a draft on.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict

from eagle3.config.gate import GateConfig
from eagle3.gate.report import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    ArmResult,
    Decision,
    LevelStats,
    LevelVerdict,
    pool_sets,
)
from eagle3.gate.serving import crossover
from eagle3.gate.stats import Interval, ratio_interval, weighted_interval, weighted_log_ratios

Ratios = dict[int, dict[int, float]]  # concurrency -> round -> paired ratio


def _ratios(num: dict[int, LevelStats], den: dict[int, LevelStats]) -> dict[int, float]:
    """Per-round ``num/den`` tok/s over the rounds both measured (rounds with no output dropped)."""
    common = sorted(set(num) & set(den))
    return {
        r: num[r].output_tok_s / den[r].output_tok_s
        for r in common
        if num[r].output_tok_s and den[r].output_tok_s
    }


def level_ratios(num: ArmResult, den: ArmResult, levels: Sequence[int]) -> Ratios:
    """The paired per-round ratios of two arms at each level."""
    return {c: _ratios(num.rounds_at(c), den.rounds_at(c)) for c in levels}


def weighted_estimate(ratios: Ratios, gate: GateConfig) -> float | None:
    """The profile's weighted geometric mean speedup over the rounds measured so far (None before
    one)."""
    logs = weighted_log_ratios(ratios, gate.shares)
    return math.exp(sum(logs) / len(logs)) if logs else None


def best_arm(arms: Sequence[ArmResult], base: ArmResult, gate: GateConfig) -> ArmResult | None:
    """The measured arm with the highest weighted speedup over ``base``."""
    scored = [
        (weighted_estimate(level_ratios(a, base, gate.levels), gate), a)
        for a in arms
        if a.error is None
    ]
    scored = [(s, a) for s, a in scored if s is not None]
    return max(scored, key=lambda sa: sa[0], default=(None, None))[1]


def _check(name: str, ok: bool, message: str) -> dict[str, object]:
    return {"name": name, "ok": ok, "message": message}


def sampled_tokens(
    rounds: dict[int, LevelStats], base: dict[int, LevelStats], name: str, gate: GateConfig
) -> tuple[bool, str]:
    """Whether an arm's tokens over its rounds agree with the baseline's when both sample: within
    ``gate.max_token_mismatch`` or 4 standard deviations of the difference of two independent draws.
    Each prompt is answered once per round by each arm, so over R rounds the difference of the
    totals has variance sum_i 2 R s_i^2, s_i^2 the variance of prompt i's lengths over both arms."""
    common = sorted(set(rounds) & set(base))
    totals = [sum(side[r].completion_tokens for r in common) for side in (rounds, base)]
    answers = [side[r].completion_lengths for side in (rounds, base) for r in common]
    per_prompt = zip(*answers, strict=True)
    variance = sum(2 * len(common) * statistics.variance(lengths) for lengths in per_prompt)
    gap = abs(totals[0] - totals[1])
    allowed = max(gate.max_token_mismatch * totals[1], 4 * math.sqrt(variance))
    message = (
        f"completion tokens over {len(common)} rounds {totals[0]} ({name}) vs {totals[1]} "
        f"(baseline): gap {gap}, allowed {allowed:.0f} (sampled: the larger of "
        f"{gate.max_token_mismatch:.0%} and 4 sd of two draws)"
    )
    return gap <= allowed, message


def sanity_checks(
    cand: dict[int, LevelStats],
    base: dict[int, LevelStats],
    others: dict[str, dict[int, LevelStats]],
    gate: GateConfig,
    sampled: bool = False,
) -> list[dict[str, object]]:
    """The physical checks over paired rounds of one level (``others``: every non-baseline arm
    compared, by name; ``sampled``: the arms sample, so their tokens are compared as draws,
    ``sampled_tokens``)."""
    checks = []
    worst = (
        max(
            ((cand[r].output_tok_s / base[r].output_tok_s) / cand[r].accept_length, r)
            for r in sorted(set(cand) & set(base))
            if cand[r].accept_length and base[r].output_tok_s
        )
        if set(cand) & set(base)
        else None
    )
    if worst is not None:
        ratio, r = worst
        ok = ratio <= 1.0 + gate.accept_bound_tolerance
        checks.append(
            _check(
                "accept_bound",
                ok,
                f"largest round speedup / accept length {ratio:.3f} (round {r}) "
                f"{'<=' if ok else '>'} 1 + tolerance {gate.accept_bound_tolerance}",
            )
        )
    base_tok_s = [s.output_tok_s for s in base.values() if s.output_tok_s > 0]
    if len(base_tok_s) >= 2:
        drift = max(base_tok_s) / min(base_tok_s) - 1.0
        ok = drift <= gate.max_baseline_drift
        span = f"{min(base_tok_s):.1f}..{max(base_tok_s):.1f}"
        message = f"baseline tok/s moved {drift:.1%} between its rounds ({span}), limit {gate.max_baseline_drift:.0%}"
        checks.append(_check("baseline_drift", ok, message))
    if sampled:
        for name, rounds in others.items():
            if set(rounds) & set(base):
                ok, message = sampled_tokens(rounds, base, name, gate)
                checks.append(_check("same_tokens", ok, message))
        return checks
    gaps = [
        (
            abs(rounds[r].completion_tokens - base[r].completion_tokens)
            / max(base[r].completion_tokens, 1),
            name,
            r,
        )
        for name, rounds in others.items()
        for r in sorted(set(rounds) & set(base))
    ]
    if gaps:
        gap, name, r = max(gaps)
        ok = gap <= gate.max_token_mismatch
        checks.append(
            _check(
                "same_tokens",
                ok,
                f"largest gap in completion tokens vs the baseline {gap:.1%} "
                f"({name}, round {r}), limit {gate.max_token_mismatch:.0%}",
            )
        )
    return checks


def _level_verdict(
    interval: Interval | None, checks: list[dict[str, object]], gate: GateConfig
) -> str:
    if interval is None or not all(c["ok"] for c in checks):
        return INCONCLUSIVE
    if interval.hi < gate.min_speedup:
        return FAIL
    return PASS if interval.lo >= gate.min_speedup else INCONCLUSIVE


def level_verdicts(
    cand: ArmResult, base: ArmResult, champ: ArmResult | None, gate: GateConfig
) -> list[LevelVerdict]:
    """Each level of the profile for ``cand`` on its own (``LevelVerdict``), ascending
    concurrency."""
    profile = gate.sampling.get(cand.sampling or "")
    sampled = profile is not None and profile.samples
    out = []
    for c, share in gate.shares.items():
        cand_r, base_r = cand.rounds_at(c), base.rounds_at(c)
        ratios = list(_ratios(cand_r, base_r).values())
        interval = ratio_interval(ratios, gate.confidence)
        estimate = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
        others = {cand.name: cand_r} | ({champ.name: champ.rounds_at(c)} if champ else {})
        checks = [
            {**check, "message": f"concurrency {c}: {check['message']}", "concurrency": c}
            for check in sanity_checks(cand_r, base_r, others, gate, sampled)
        ]
        level = cand.level(c)
        out.append(
            LevelVerdict(
                c,
                share,
                len(ratios),
                estimate,
                interval.to_list() if interval else None,
                _level_verdict(interval, checks, gate),
                slower=interval is not None and interval.hi < 1.0,
                accept_length=level.accept_length if level else None,
                checks=checks,
            )
        )
    return out


def _slower(lv: LevelVerdict) -> str:
    lo, hi = lv.speedup_interval or [0.0, 0.0]
    return (
        f"concurrency {lv.concurrency} ({lv.share:.0%} of the traffic) is slower than the baseline: speedup "
        f"{lv.speedup:.3f} [{lo:.3f}, {hi:.3f}]"
    )


def _blocking(lv: LevelVerdict, gate: GateConfig) -> bool:
    return lv.slower and lv.share > 0 and lv.share >= gate.level_weight_floor


def _verdict(
    speed: Interval | None,
    gain: Interval | None,
    has_champion: bool,
    checks: list,
    levels: list[LevelVerdict],
    gate: GateConfig,
    rounds: int,
) -> tuple[str, list[str]]:
    """The verdict and its reasons once the draft was measured and its accept length cleared
    ``min_accept``."""
    bad = [f"sanity check {c['name']} failed: {c['message']}" for c in checks if not c["ok"]]
    if bad:
        return INCONCLUSIVE, bad
    if speed is None or (has_champion and gain is None):
        return INCONCLUSIVE, [f"{rounds} paired round(s): an interval needs at least 2"]
    fails = [
        f"{_slower(lv)}, and it carries >= level_weight_floor {gate.level_weight_floor:.0%}"
        for lv in levels
        if _blocking(lv, gate)
    ]
    if speed.hi < gate.min_speedup:
        fails.append(f"weighted speedup {speed} is below min_speedup {gate.min_speedup}")
    if gain is not None and gain.hi < gate.min_gain_over_champion:
        fails.append(
            f"gain over champion {gain} is below min_gain_over_champion {gate.min_gain_over_champion}"
        )
    if fails:
        return FAIL, fails
    open_ = []
    if speed.lo < gate.min_speedup:
        open_.append(f"weighted speedup {speed} contains min_speedup {gate.min_speedup}")
    if gain is not None and gain.lo < gate.min_gain_over_champion:
        open_.append(
            f"gain over champion {gain} contains min_gain_over_champion {gate.min_gain_over_champion}"
        )
    return (INCONCLUSIVE, open_) if open_ else (PASS, [])


def _measured(
    draft: str, best: ArmResult, base: ArmResult, champ: ArmResult | None, gate: GateConfig
) -> Decision:
    levels = level_verdicts(best, base, champ, gate)
    ratios = level_ratios(best, base, gate.levels)
    speed = weighted_interval(ratios, gate.shares, gate.confidence)
    gain = (
        weighted_interval(level_ratios(best, champ, gate.levels), gate.shares, gate.confidence)
        if champ
        else None
    )
    accept = best.accept().accept_length
    checks = [check for lv in levels if lv.share > 0 for check in lv.checks]
    rounds = len(weighted_log_ratios(ratios, gate.shares))
    if accept is None or accept < gate.min_accept:
        verdict, reasons = (
            FAIL,
            [f"accept length {accept} < min_accept {gate.min_accept} (every level pooled)"],
        )
    else:
        verdict, reasons = _verdict(speed, gain, champ is not None, checks, levels, gate, rounds)
    warnings = [
        f"{_slower(lv)}: serve it without speculation (see the serving configuration)"
        for lv in levels
        if lv.slower and not _blocking(lv, gate)
    ]
    points = [(lv.concurrency, lv.speedup) for lv in levels if lv.speedup is not None]
    return Decision(
        draft,
        verdict == PASS,
        best.name,
        weighted_estimate(ratios, gate),
        accept,
        weighted_estimate(level_ratios(best, champ, gate.levels), gate) if champ else None,
        reasons,
        verdict=verdict,
        rounds=rounds,
        speedup_interval=speed.to_list() if speed else None,
        gain_interval=gain.to_list() if gain else None,
        checks=checks,
        levels=levels,
        warnings=warnings,
        crossover=asdict(crossover(points)) if points else None,
        by_set=pool_sets(best.rounds),
    )


def _decide_draft(
    draft: str,
    mine: list[ArmResult],
    base: ArmResult | None,
    champ: ArmResult | None,
    champion_arms: list[ArmResult],
    gate: GateConfig,
    refused: list[str],
) -> Decision:
    best = best_arm(mine, base, gate) if base is not None else None
    reasons = [*refused, *(f"{a.name}: {a.error}" for a in mine if a.error)]
    if champion_arms and champ is None:
        reasons.append(
            "the champion could not be measured: " + "; ".join(str(a.error) for a in champion_arms)
        )
    if best is None or base is None:
        reasons.append(
            "no paired measurement on the traffic profile" + ("" if base else " (baseline failed)")
        )
    if reasons or best is None or base is None:
        return Decision(
            draft, False, best.name if best else None, None, None, None, reasons, verdict=FAIL
        )
    return _measured(draft, best, base, champ, gate)


def _first_measured(arms: Sequence[ArmResult]) -> ArmResult | None:
    return next((a for a in arms if a.error is None and a.rounds), None)


def decide(
    arms: list[ArmResult], gate: GateConfig, refused: dict[str, list[str]] | None = None
) -> list[Decision]:
    """One decision per candidate draft (see the module docstring); ``refused`` maps a draft to
    static failures."""
    base = _first_measured([a for a in arms if a.role == "baseline"])
    champion_arms = [a for a in arms if a.role == "champion"]
    champ = _first_measured(champion_arms)
    drafts = list(dict.fromkeys(a.draft for a in arms if a.role == "candidate" and a.draft))
    drafts += [d for d in (refused or {}) if d not in drafts]
    decisions = []
    for draft in drafts:
        mine = [a for a in arms if a.role == "candidate" and a.draft == draft]
        static = list((refused or {}).get(draft, []))
        decisions.append(_decide_draft(draft, mine, base, champ, champion_arms, gate, static))
    return decisions


def undecided(decisions: list[Decision]) -> bool:
    """True while another round is worth measuring: an interval still open with every sanity check
    holding, or a PASS. A PASS is final only after ``gate.max_rounds``: promoting is the costly
    mistake, so noise has to fool every round to cause it, while a FAIL or a failed check may end
    the measurement after ``gate.min_rounds``."""
    return any(
        d.verdict == PASS or (d.verdict == INCONCLUSIVE and all(c["ok"] for c in d.checks))
        for d in decisions
    )


def overall(decisions: list[Decision]) -> str:
    """The gate's verdict: PASS if a draft passed, else INCONCLUSIVE if one was, else FAIL."""
    verdicts = {d.verdict for d in decisions}
    return PASS if PASS in verdicts else INCONCLUSIVE if INCONCLUSIVE in verdicts else FAIL
