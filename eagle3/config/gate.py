"""The ``speculative`` and ``gate`` sections of the pipeline config.

``gate.traffic`` is the served-load profile the verdict is decided on: concurrency levels and the
share of the served load each carries (docs/DESIGN.md, "The served-load profile"; the statistic is
``eagle3.gate.stats``, the rules ``eagle3.gate.verdict``). It replaced ``gate.concurrency`` (the
levels measured) and ``gate.decision_concurrency`` (the one level decided on): a config that still
has either fails at load, naming the ``gate.traffic`` that reproduces it.

``gate.sampling`` is how that traffic samples: named profiles
(``eagle3.config.sampling.SamplingProfile``), each measured over the traffic with its own verdict;
greedy by default.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from eagle3.config.base import StrictModel
from eagle3.config.sampling import SamplingProfile


class SpeculativeConfig(StrictModel):
    """One speculative setting of the EAGLE3 arm (set all of steps, topk and draft tokens, never
    some)."""

    algorithm: str = "EAGLE3"
    num_steps: int = Field(default=3, gt=0)
    eagle_topk: int = Field(default=1, gt=0)
    num_draft_tokens: int = Field(default=4, gt=0)

    @model_validator(mode="after")
    def _topk_one_chain(self) -> SpeculativeConfig:
        if self.eagle_topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError(
                f"with speculative.eagle_topk=1 set speculative.num_draft_tokens to num_steps+1 "
                f"({self.num_steps + 1}), not {self.num_draft_tokens}"
            )
        return self


def _replacement(data: dict[str, Any]) -> str:
    """The ``gate.traffic`` that decides as a config with the removed keys did: all weight on the
    decision level."""
    levels = data.get("concurrency") or [1, 4, 16]
    decision = data.get("decision_concurrency", 1)
    traffic = {int(c): int(c == decision) for c in levels}
    return "{" + ", ".join(f"{c}: {w}" for c, w in traffic.items()) + "}"


def check_traffic(traffic: dict[int, float], where: str) -> dict[int, float]:
    """A ``{concurrency: weight}`` profile, sorted; ``ValueError`` naming ``where`` and the fix
    otherwise."""
    example = f"e.g. {where}={{1: 1, 4: 1, 16: 1}}"
    if not traffic:
        raise ValueError(
            f"{where} is empty: give at least one {{concurrency: weight}} level, {example}"
        )
    bad = {c: w for c, w in traffic.items() if c < 1 or w < 0 or not math.isfinite(w)}
    if bad:
        raise ValueError(f"{where} {bad}: concurrencies must be >= 1 and weights >= 0, {example}")
    if not any(traffic.values()):
        raise ValueError(
            f"{where} {traffic} weighs every level 0: give some level a weight, {example}"
        )
    return dict(sorted(traffic.items()))


# Fields of the served-load profile, added after gates were first recorded.
_LATER_FIELDS = ("profile", "max_levels", "profile_note")


def _greedy() -> dict[str, SamplingProfile]:
    return {"greedy": SamplingProfile()}


class GateConfig(StrictModel):
    """The benchmark gate: prompts, the served-load profile, thresholds, and the interleaved
    rounds."""

    prompt_sets: dict[str, str] = Field(default_factory=dict)
    prompts_per_set: int = Field(default=32, gt=0)
    warmup_requests: int = Field(default=2, ge=0)
    max_new_tokens: int = Field(default=256, gt=0)
    traffic: dict[int, float] = Field(
        default_factory=lambda: {1: 1.0, 4: 1.0, 16: 1.0},
        description="The served load: {concurrency: weight}, each level's share of what is served (weights are "
        "normalized; 0 measures a level for the crossover and the adaptive config without weighing it).",
    )
    profile: Literal["config", "served"] = Field(
        default="config",
        description="Where the load profile comes from: this config (traffic, max_new_tokens, "
        "prompt_sets), or the served sources' request logs (concurrency over time, completion "
        "lengths, and the held-out served prompts as the 'served' set; "
        "eagle3.gate.served_profile).",
    )
    max_levels: int = Field(
        default=3, gt=0, description="The most concurrency levels a served profile keeps."
    )
    profile_note: str = Field(
        default="",
        description="How the served profile was built (written by it, printed in the report).",
    )
    level_weight_floor: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="A level carrying at least this share of the traffic must not be significantly slower than the "
        "baseline (its interval below 1), whatever the weighted speedup; lighter ones only warn.",
    )
    sampling: dict[str, SamplingProfile] = Field(
        default_factory=_greedy,
        description="How the traffic samples: {name: profile}, each measured over its levels "
        "with its own verdict (eagle3.config.sampling); the gate passes when every profile that "
        "decides passes.",
    )
    min_speedup: float = Field(default=1.05, gt=0)
    min_accept: float = Field(default=1.5, ge=1)
    min_gain_over_champion: float = Field(default=1.0, gt=0)
    sweep: list[SpeculativeConfig] = Field(default_factory=list)
    # Interleaved rounds and the verdict's statistic (eagle3.gate.rounds, eagle3.gate.verdict).
    min_rounds: int = Field(
        default=3,
        ge=2,
        description="Rounds (one batch per arm and level, order alternating) before a FAIL may stop.",
    )
    max_rounds: int = Field(
        default=8,
        ge=2,
        description="Rounds at most: a PASS needs all; still open after: INCONCLUSIVE.",
    )
    confidence: float = Field(
        default=0.9,
        gt=0.5,
        lt=1.0,
        description="Two-sided level of the t interval on the paired speedups.",
    )
    max_baseline_drift: float = Field(
        default=0.2,
        gt=0,
        description="Largest max/min - 1 of the baseline's tok/s over its rounds, else INCONCLUSIVE.",
    )
    accept_bound_tolerance: float = Field(
        default=0.1,
        ge=0,
        description="A round's speedup may exceed its accept length by this fraction (noise).",
    )
    max_token_mismatch: float = Field(
        default=0.02,
        ge=0,
        description="Largest relative gap in completion tokens between arms within one round.",
    )

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        removed = [
            k
            for k in ("concurrency", "decision_concurrency")
            if isinstance(data, dict) and k in data
        ]
        if removed:
            keys = " and ".join(f"gate.{k}" for k in removed)
            raise ValueError(
                f"{keys} {'were' if len(removed) > 1 else 'was'} replaced by gate.traffic, a {{concurrency: weight}} "
                f"map decided on as a whole: remove {keys} and set gate.traffic={_replacement(data)} to decide as "
                "before (every level measured, the decision level weighed alone), or weigh the levels by your "
                "served load, e.g. gate.traffic={1: 1, 4: 1, 16: 1}"
            )
        return data

    @field_validator("traffic")
    @classmethod
    def _profile(cls, traffic: dict[int, float]) -> dict[int, float]:
        return check_traffic(traffic, "gate.traffic")

    @field_validator("sampling")
    @classmethod
    def _sampling(cls, sampling: dict[str, SamplingProfile]) -> dict[str, SamplingProfile]:
        example = "e.g. gate.sampling={greedy: {}, served: {temperature: 1.0, top_p: 0.95}}"
        if not sampling:
            raise ValueError(f"gate.sampling is empty: give at least one profile, {example}")
        if not any(p.decides for p in sampling.values()):
            raise ValueError(
                f"no gate.sampling profile decides: set decides=true on one, {example}"
            )
        out = {}
        for name, p in sampling.items():
            traffic = p.traffic and check_traffic(p.traffic, f"gate.sampling.{name}.traffic")
            out[name] = p if traffic is None else p.model_copy(update={"traffic": traffic})
        return out

    @model_validator(mode="after")
    def _rounds(self) -> GateConfig:
        if self.min_rounds > self.max_rounds:
            raise ValueError(
                f"gate.min_rounds={self.min_rounds} > gate.max_rounds={self.max_rounds}: raise max_rounds or lower "
                "min_rounds"
            )
        return self

    @model_validator(mode="after")
    def _sampled_sets(self) -> GateConfig:
        for name, profile in self.sampling.items():
            unknown = sorted(set(profile.sets) - set(self.prompt_sets)) if self.prompt_sets else []
            if unknown:
                sets = sorted(self.prompt_sets)
                raise ValueError(
                    f"gate.sampling.{name}.sets names {unknown}, not gate prompt sets ({sets})"
                )
        return self

    def identity(self) -> dict[str, Any]:
        """The fields a gate's fingerprint hashes: all of them, except ``sampling`` when it is the
        default greedy profile alone (a gate that measures greedily, as every gate did before
        profiles existed, keeps its fingerprint and with it its cached report), and the served-load
        profile's fields while at their defaults."""
        data = self.model_dump(mode="json")
        if self.sampling == _greedy():
            del data["sampling"]
        for name in _LATER_FIELDS:  # hashed only when set, so older gates keep their fingerprint
            if getattr(self, name) == type(self).model_fields[name].get_default(
                call_default_factory=True
            ):
                del data[name]
        return data

    def for_sampling(self, name: str) -> GateConfig:
        """This config as one profile's verdict sees it: its levels (the profile's ``traffic`` when
        it has one)."""
        profile = self.sampling[name]
        if profile.traffic is None:
            return self
        return self.model_copy(update={"traffic": profile.traffic})

    @property
    def levels(self) -> list[int]:
        """Every concurrency of the profile, ascending (the weight-0 ones included: they are
        measured)."""
        return list(self.traffic)

    @property
    def shares(self) -> dict[int, float]:
        """Each level's share of the traffic: the weights normalized to sum to 1."""
        total = sum(self.traffic.values())
        return {c: w / total for c, w in self.traffic.items()}
