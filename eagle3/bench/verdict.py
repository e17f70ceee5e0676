"""The gate's verdict: a pure function of the arms' measured rounds and ``GateConfig`` (DESIGN §6).

Per candidate draft, at ``gate.decision_concurrency``, with its best spec config (highest pooled tok/s):

- **Statistic** (``eagle3.bench.stats``): the per-round paired speedups ``candidate tok/s / baseline tok/s`` of the
  same round (the two were measured back to back) and their t interval at ``gate.confidence``; the same for the
  gain over the champion when one exists.
- **Sanity checks** (``checks``); any failure makes the verdict INCONCLUSIVE with its reason, whatever the interval
  says, because it shows the arms did not see the same machine or did not do the same work:
  ``accept_bound`` (``eagle3.bench.report.PHYSICAL_BOUND``: no round's speedup above its accept length, with tolerance),
  ``baseline_drift`` (the baseline's own rounds agree within ``gate.max_baseline_drift``) and ``same_tokens``
  (every arm generated as many tokens as the baseline in each round, within ``gate.max_token_mismatch``).
- **Verdict**: FAIL when the draft was refused or not measured, its accept length is below ``min_accept``, or an
  upper bound is below its threshold; PASS when every check holds and each lower bound clears its threshold
  (``min_speedup``, and ``min_gain_over_champion`` when a champion exists); INCONCLUSIVE otherwise. Before
  ``gate.max_rounds`` an open interval (or a PASS: see ``undecided``) means "measure another round".

Noise that slows one arm by the same amount in every measured round cannot be told from a real difference by any
statistic; the checks catch it when it exceeds the physical bound or does not last the whole measurement. That is
why a PASS needs all ``gate.max_rounds`` rounds: to promote a slow draft, noise must cover the whole measurement.
Symmetric noise (both arms slowed in the same rounds) cancels in the paired ratios, but a baseline that moves more
than ``gate.max_baseline_drift`` is INCONCLUSIVE even so: such a machine is too unstable to certify a draft on.
"""

from __future__ import annotations

from collections.abc import Sequence

from eagle3.bench.report import FAIL, INCONCLUSIVE, PASS, ArmResult, Decision, LevelStats
from eagle3.bench.stats import Interval, ratio_interval
from eagle3.config import GateConfig


def best_arm(arms: Sequence[ArmResult], c: int) -> ArmResult | None:
    measured = [a for a in arms if a.error is None and a.level(c) is not None]
    return max(measured, key=lambda a: a.level(c).output_tok_s, default=None)  # type: ignore[union-attr]


def _ratios(num: dict[int, LevelStats], den: dict[int, LevelStats]) -> list[float]:
    """Per-round ``num/den`` tok/s over the rounds both measured, in round order (rounds with no output dropped)."""
    common = sorted(set(num) & set(den))
    return [num[r].output_tok_s / den[r].output_tok_s for r in common if num[r].output_tok_s and den[r].output_tok_s]


def _check(name: str, ok: bool, message: str) -> dict[str, object]:
    return {"name": name, "ok": ok, "message": message}


def sanity_checks(
    cand: dict[int, LevelStats], base: dict[int, LevelStats], others: dict[str, dict[int, LevelStats]], gate: GateConfig
) -> list[dict[str, object]]:
    """The physical checks over paired rounds (``others``: every non-baseline arm compared, by name)."""
    checks = []
    worst = max(
        ((cand[r].output_tok_s / base[r].output_tok_s) / cand[r].accept_length, r)
        for r in sorted(set(cand) & set(base))
        if cand[r].accept_length and base[r].output_tok_s
    ) if set(cand) & set(base) else None  # fmt: skip
    if worst is not None:
        ratio, r = worst
        ok = ratio <= 1.0 + gate.accept_bound_tolerance
        checks.append(_check("accept_bound", ok, f"largest round speedup / accept length {ratio:.3f} (round {r}) "
                             f"{'<=' if ok else '>'} 1 + tolerance {gate.accept_bound_tolerance}"))  # fmt: skip
    base_tok_s = [s.output_tok_s for s in base.values() if s.output_tok_s > 0]
    if len(base_tok_s) >= 2:
        drift = max(base_tok_s) / min(base_tok_s) - 1.0
        ok = drift <= gate.max_baseline_drift
        span = f"{min(base_tok_s):.1f}..{max(base_tok_s):.1f}"
        message = f"baseline tok/s moved {drift:.1%} between its rounds ({span}), limit {gate.max_baseline_drift:.0%}"
        checks.append(_check("baseline_drift", ok, message))
    gaps = [
        (abs(rounds[r].completion_tokens - base[r].completion_tokens) / max(base[r].completion_tokens, 1), name, r)
        for name, rounds in others.items()
        for r in sorted(set(rounds) & set(base))
    ]
    if gaps:
        gap, name, r = max(gaps)
        ok = gap <= gate.max_token_mismatch
        checks.append(_check("same_tokens", ok, f"largest gap in completion tokens vs the baseline {gap:.1%} "
                             f"({name}, round {r}), limit {gate.max_token_mismatch:.0%}"))  # fmt: skip
    return checks


def _verdict(
    speed: Interval | None, gain: Interval | None, has_champion: bool, checks: list, gate: GateConfig, rounds: int
) -> tuple[str, list[str]]:
    """The verdict and its reasons once the draft was measured and its accept length cleared ``min_accept``."""
    bad = [f"sanity check {c['name']} failed: {c['message']}" for c in checks if not c["ok"]]
    if bad:
        return INCONCLUSIVE, bad
    if speed is None or (has_champion and gain is None):
        return INCONCLUSIVE, [f"{rounds} paired round(s): an interval needs at least 2"]
    if speed.hi < gate.min_speedup:
        return FAIL, [f"speedup {speed} is below min_speedup {gate.min_speedup}"]
    if gain is not None and gain.hi < gate.min_gain_over_champion:
        return FAIL, [f"gain over champion {gain} is below min_gain_over_champion {gate.min_gain_over_champion}"]
    open_ = []
    if speed.lo < gate.min_speedup:
        open_.append(f"speedup {speed} contains min_speedup {gate.min_speedup}")
    if gain is not None and gain.lo < gate.min_gain_over_champion:
        open_.append(f"gain over champion {gain} contains min_gain_over_champion {gate.min_gain_over_champion}")
    return (INCONCLUSIVE, open_) if open_ else (PASS, [])


def _decide_draft(
    draft: str, mine: list[ArmResult], base: ArmResult | None, champ: ArmResult | None, champion_arms: list[ArmResult],
    gate: GateConfig, refused: list[str],
) -> Decision:  # fmt: skip
    c = gate.decision_concurrency
    best = best_arm(mine, c)
    reasons = [*refused, *(f"{a.name}: {a.error}" for a in mine if a.error)]
    if champion_arms and champ is None:
        reasons.append("the champion could not be measured: " + "; ".join(str(a.error) for a in champion_arms))
    if best is None or base is None:
        reasons.append("no measurement at the decision concurrency" + ("" if base else " (baseline failed)"))
    if reasons or best is None or base is None:
        return Decision(draft, False, best.name if best else None, None, None, None, reasons, verdict=FAIL)
    cand_r, base_r = best.rounds_at(c), base.rounds_at(c)
    others = {best.name: cand_r} | ({champ.name: champ.rounds_at(c)} if champ else {})
    speed = ratio_interval(_ratios(cand_r, base_r), gate.confidence)
    gain = ratio_interval(_ratios(cand_r, champ.rounds_at(c)), gate.confidence) if champ else None
    accept = best.level(c).accept_length  # type: ignore[union-attr]
    checks = sanity_checks(cand_r, base_r, others, gate)
    rounds = len(set(cand_r) & set(base_r))
    if accept is None or accept < gate.min_accept:
        verdict, reasons = FAIL, [f"accept length {accept} < min_accept {gate.min_accept} at concurrency {c}"]
    else:
        verdict, reasons = _verdict(speed, gain, champ is not None, checks, gate, rounds)
    return Decision(
        draft, verdict == PASS, best.name, speed.estimate if speed else None, accept, gain.estimate if gain else None,
        reasons, verdict=verdict, rounds=rounds, speedup_interval=speed.to_list() if speed else None,
        gain_interval=gain.to_list() if gain else None, checks=checks,
    )  # fmt: skip


def decide(arms: list[ArmResult], gate: GateConfig, refused: dict[str, list[str]] | None = None) -> list[Decision]:
    """One decision per candidate draft (see the module docstring); ``refused`` maps a draft to static failures."""
    c = gate.decision_concurrency
    base = best_arm([a for a in arms if a.role == "baseline"], c)
    champion_arms = [a for a in arms if a.role == "champion"]
    champ = best_arm(champion_arms, c)
    drafts = list(dict.fromkeys(a.draft for a in arms if a.role == "candidate" and a.draft))
    drafts += [d for d in (refused or {}) if d not in drafts]
    decisions = []
    for draft in drafts:
        mine = [a for a in arms if a.role == "candidate" and a.draft == draft]
        static = list((refused or {}).get(draft, []))
        decisions.append(_decide_draft(draft, mine, base, champ, champion_arms, gate, static))
    return decisions


def undecided(decisions: list[Decision]) -> bool:
    """True while another round is worth measuring: an interval still open with every sanity check holding, or a
    PASS. A PASS is final only after ``gate.max_rounds``: promoting is the costly mistake, so noise has to fool every
    round to cause it, while a FAIL or a failed check may end the measurement after ``gate.min_rounds``."""
    return any(d.verdict == PASS or (d.verdict == INCONCLUSIVE and all(c["ok"] for c in d.checks)) for d in decisions)


def overall(decisions: list[Decision]) -> str:
    """The gate's verdict: PASS if a draft passed, else INCONCLUSIVE if one was, else FAIL."""
    verdicts = {d.verdict for d in decisions}
    return PASS if PASS in verdicts else INCONCLUSIVE if INCONCLUSIVE in verdicts else FAIL
