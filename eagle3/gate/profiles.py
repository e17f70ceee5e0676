"""One gate over several sampling profiles (``gate.sampling``): each profile measured over its
levels with its own verdict, and one decision per draft that combines them.

Design choices:
- Every arm is measured once per profile, on the same servers: the arms of the primary profile (the
  first one that decides, in config order) are the plan's own and keep their names; each other
  profile gets copies named ``<arm>@<profile>`` (``expand``), so a report of a one-profile gate
  reads as before. Profiles are measured one after the other, each in its own interleaved rounds
  (``eagle3.gate.rounds``) at its own levels (``GateConfig.for_sampling``), stopping when its own
  verdict settles: the pairing that makes the statistic is within a profile, so nothing is gained by
  interleaving profiles.
- Before a profile that samples, the sampling probe (``eagle3.gate.sampling_probe``) asks every
  speculative arm whether it honours sampling; an arm that does not is not measured at that profile
  (its copy carries the probe's line as its error), and the profile's decision says so. The greedy
  profile still gates on that engine.
- A draft's decision (``combine``): the primary profile's decision, with ``sampling`` naming it;
  with several profiles its verdict is the worst over the profiles that decide (FAIL, then
  INCONCLUSIVE, then PASS), its reasons are theirs prefixed with the sampling they were measured at,
  a profile that only reports adds a warning when it did not pass, and ``profiles`` keeps each
  profile's own decision for the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from eagle3.config.gate import GateConfig
from eagle3.gate.prompts import BenchPrompt
from eagle3.gate.report import FAIL, INCONCLUSIVE, PASS, ArmResult, Decision
from eagle3.gate.rounds import measure_rounds
from eagle3.gate.verdict import decide, undecided

SEVERITY = {FAIL: 0, INCONCLUSIVE: 1, PASS: 2}


def primary(gate: GateConfig) -> str:
    """The profile whose numbers a decision shows: the first that decides."""
    return next(name for name, profile in gate.sampling.items() if profile.decides)


def order(gate: GateConfig) -> list[str]:
    """The profiles in measuring order: the primary first, then the others as configured."""
    first = primary(gate)
    return [first, *(name for name in gate.sampling if name != first)]


def arm_name(name: str, profile: str, gate: GateConfig) -> str:
    return name if profile == primary(gate) else f"{name}@{profile}"


def expand(arms: list[ArmResult], gate: GateConfig) -> list[ArmResult]:
    """The plan's arms tagged with the primary profile, then a fresh copy of each per other profile
    (same server, same errors so far, no rounds)."""
    first = primary(gate)
    for arm in arms:
        arm.sampling = first
    fresh = {"levels": [], "rounds": [], "preflight": [], "flush_failures": []}
    copies = [
        dataclasses.replace(arm, name=arm_name(arm.name, p, gate), sampling=p, **fresh)
        for p in order(gate)[1:]
        for arm in arms
    ]
    return [*arms, *copies]


def of_profile(arms: list[ArmResult], profile: str) -> list[ArmResult]:
    return [a for a in arms if a.sampling == profile]


def share_servers(arms: list[ArmResult], gate: GateConfig) -> None:
    """After the primary arms are up: each copy gets its server's URL, and the server's error if it
    has one."""
    first = {a.name: a for a in of_profile(arms, primary(gate))}
    for arm in arms:
        if arm.sampling != primary(gate):
            base = first[arm.name.rsplit("@", 1)[0]]
            arm.url, arm.error = base.url, arm.error or base.error


Probe = Callable[
    [ArmResult, str], str | None
]  # (speculative arm, profile) -> why it ignores sampling, or None


def measure(
    arms: list[ArmResult],
    prompts: list[BenchPrompt],
    gate: GateConfig,
    refused: dict[str, list[str]],
    probe: Probe,
) -> None:
    """Measure every profile in turn (module docstring); ``probe`` runs before a profile that
    samples."""
    for name in order(gate):
        profile, mine = gate.sampling[name], of_profile(arms, name)
        if profile.samples:
            for arm in mine:
                if arm.role != "baseline" and arm.error is None:
                    arm.error = probe(arm, name)
        live = [(arm, arm.url) for arm in mine if arm.error is None]
        if all(arm.role == "baseline" for arm, _ in live):
            continue  # nothing to compare at this profile: its decisions say why
        at = gate.for_sampling(name)

        def keep_going(mine: list[ArmResult] = mine, at: GateConfig = at) -> bool:
            return undecided(decide(mine, at, refused))

        measure_rounds(live, prompts, at, profile=profile, keep_going=keep_going)


def _label(gate: GateConfig, name: str) -> str:
    profile = gate.sampling[name]
    return f"{name} ({profile.describe()}{'' if profile.decides else ', reported only'})"


def combine(per: dict[str, list[Decision]], gate: GateConfig) -> list[Decision]:
    """One decision per draft from each profile's decisions (module docstring)."""
    first = primary(gate)
    out = []
    for decision in per[first]:
        mine = {
            name: next(d for d in per[name] if d.draft == decision.draft) for name in order(gate)
        }
        for name, d in mine.items():
            d.sampling = name
        if len(mine) == 1:
            out.append(decision)
            continue
        deciding = {name: d for name, d in mine.items() if gate.sampling[name].decides}
        verdict = min((d.verdict for d in deciding.values()), key=lambda v: SEVERITY[str(v)])
        reasons = [
            f"at {_label(gate, name)}: {r}" for name, d in deciding.items() for r in d.reasons
        ]
        reported = [
            _reported(gate, name, d)
            for name, d in mine.items()
            if name not in deciding and d.verdict != PASS
        ]
        combined = dataclasses.replace(
            decision,
            passed=verdict == PASS,
            verdict=verdict,
            reasons=reasons,
            warnings=[*decision.warnings, *reported],
            profiles=[mine[name] for name in order(gate)],
        )
        out.append(combined)
    return out


def _reported(gate: GateConfig, name: str, d: Decision) -> str:
    why = f": {'; '.join(d.reasons)}" if d.reasons else ""
    return f"at {_label(gate, name)}: {str(d.verdict).upper()}{why}"


def decide_profiles(
    arms: list[ArmResult], gate: GateConfig, refused: dict[str, list[str]]
) -> list[Decision]:
    """Each profile's decisions over its own arms and levels, combined per draft."""
    per = {
        name: decide(of_profile(arms, name), gate.for_sampling(name), refused)
        for name in order(gate)
    }
    return combine(per, gate)


def describe(gate: GateConfig) -> dict[str, dict[str, object]]:
    """``GateReport.sampling``: each profile's label, whether it decides, and the levels it is
    served at."""
    return {
        name: {"label": p.describe(), "decides": p.decides, "traffic": p.traffic or gate.traffic}
        for name, p in gate.sampling.items()
    }
