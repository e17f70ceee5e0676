"""How requests sample: ``SamplingParams`` (what one request sends, as SGLang's ``sampling_params``
take it) and ``SamplingProfile`` (one sampling the gate measures at, ``GateConfig.sampling``).

SGLang's rules, kept here so every user of the model reads them once:
- A temperature below ``GREEDY_EPS`` is greedy (SGLang turns it into ``top_k=1``), and so is
  ``top_k=1``.
- Otherwise the target's distribution is softmax(logits / temperature), then the ``top_k`` most
  likely tokens renormalised (``-1``: every token), then the smallest set whose mass reaches
  ``top_p`` renormalised.
- A speculative server verifies a sampled request by speculative sampling
  (``eagle3.serve.reference.sampling``), so its output has the target's distribution; greedy
  requests are verified by argmax.

A profile is a sampling plus where it is served: the prompt sets that send other settings
(``sets``), the levels of the traffic it is served at (``traffic``, default the gate's), whether its
verdict decides (``decides``), and the seed its requests' ``sampling_seed`` derive from
(``request_seed``: the same per prompt and round in every arm, so a seeded gate reproduces its own
tokens on servers that honour seeds).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from pydantic import Field, field_validator

from eagle3.config.base import StrictModel

GREEDY_EPS = 1e-6  # SGLang's _SAMPLING_EPS: a temperature below it is greedy


def _number(value: float) -> str:
    return f"{value:g}"


class SamplingParams(StrictModel):
    """The sampling fields of one request: temperature, top_p, top_k (SGLang's names, ranges and
    defaults, except temperature, greedy by default here)."""

    temperature: float = Field(default=0.0, ge=0, description="0 (below 1e-6): greedy.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus mass kept (1: every token).")
    top_k: int = Field(
        default=-1, description="Most likely tokens kept (-1: every token; 1: greedy)."
    )

    @field_validator("temperature")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {value}")
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value < 1 and value != -1:
            raise ValueError(
                f"top_k must be -1 (every token) or at least 1 (1 is greedy), got {value}"
            )
        return value

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    def label(self) -> str:
        """``greedy``, or the settings that shape the distribution: ``T=1 top_p=0.95`` (defaults
        left out)."""
        if self.greedy:
            return "greedy"
        parts = [f"T={_number(self.temperature)}"]
        parts += [f"top_p={_number(self.top_p)}"] if self.top_p < 1 else []
        parts += [f"top_k={self.top_k}"] if self.top_k > 1 else []
        return " ".join(parts)

    def request(self) -> dict[str, Any]:
        """The ``sampling_params`` fields a request sends (greedy as ``temperature: 0``, SGLang's
        spelling)."""
        if self.greedy:
            return {"temperature": 0.0}
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}

    def params(self) -> SamplingParams:
        """Just the sampling fields (a profile's own, without where it is served)."""
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)


class SamplingProfile(SamplingParams):
    """One sampling the gate measures at: every arm sends it on every prompt (``sets`` overrides it
    per prompt set), at the levels of ``traffic`` (default ``gate.traffic``); each profile gets its
    own verdict, and the gate passes only when every profile that ``decides`` passes."""

    sets: dict[str, SamplingParams] = Field(
        default_factory=dict,
        description="Prompt sets served at other settings, {set name: sampling}; the others "
        "use the profile's.",
    )
    traffic: dict[int, float] | None = Field(
        default=None,
        description="The {concurrency: weight} levels this sampling is served at; None: "
        "gate.traffic.",
    )
    decides: bool = Field(
        default=True,
        description="Whether this profile's verdict decides the gate; False: measured and "
        "reported only.",
    )
    seed: int = Field(
        default=0,
        description="Seeds each request's sampling_seed (with its prompt id and round), the "
        "same in every arm.",
    )

    def for_set(self, set_name: str) -> SamplingParams:
        """What a prompt of ``set_name`` sends."""
        return self.sets.get(set_name, self.params())

    @property
    def samples(self) -> bool:
        """Whether any of its requests sample (the profile or one of its sets is not greedy)."""
        return not self.greedy or any(not s.greedy for s in self.sets.values())

    def describe(self) -> str:
        """The label with its per-set exceptions: ``T=1 top_p=0.95 (code: greedy)``."""
        extra = ", ".join(f"{name}: {s.label()}" for name, s in sorted(self.sets.items()))
        return f"{self.label()} ({extra})" if extra else self.label()

    def request_seed(self, prompt_id: str, round_: int) -> int:
        """The ``sampling_seed`` of one prompt in one round: a stable 63-bit hash of the profile's
        seed, the prompt id and the round (never Python's salted ``hash``), so runs and arms
        agree."""
        digest = hashlib.sha256(f"{self.seed}:{prompt_id}:{round_}".encode()).digest()
        return int.from_bytes(digest[:8], "little") >> 1
