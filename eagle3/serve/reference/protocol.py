"""The types shared by the HTTP layer, the scheduler and the engines (torch-free, so synthetic mode
stays light).

``Engine`` is the seam for a future speculative engine (EAGLE-3 draft + chain verification): it
implements the same calls, may add several tokens to a sequence per step, and counts target forward
passes in ``verify_ct``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

DEFAULT_NUM_STEPS = 3  # draft tokens a verify pass checks without --speculative-num-steps


@dataclass
class SamplingParams:
    """The SGLang ``sampling_params`` subset. A temperature below 1e-6 (or ``top_k=1``) is greedy;
    ``top_k=-1`` disables top-k; ``sampling_seed`` seeds the request's coins
    (``eagle3.serve.reference.sampling``)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-6 or self.top_k == 1


@dataclass
class Sequence:
    """One request inside the engine: prompt, generated ids, finish state, and its callbacks'
    payloads."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    verify_ct: int = 0
    # per verify pass (a speculative engine's)
    accepted_drafts: list[int] = field(default_factory=list)
    created: float = field(default_factory=time.monotonic)
    sampling: Any = None  # the engine's sampling state of it (``sampling.RowSampling``)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Engine(Protocol):
    """What the scheduler drives: admit sequences into the running batch, advance it by one step."""

    max_running: int

    def admit(self, seqs: list[Sequence]) -> None:
        """Queue sequences to join the running batch at the next ``step``."""

    def step(self) -> tuple[list[Sequence], list[Sequence]]:
        """One forward pass: returns (sequences that got new tokens, sequences that finished and
        left)."""

    def num_running(self) -> int:
        """Sequences in the batch, admitted or running."""

    def reset(self) -> None:
        """Drop every sequence (after a failed step)."""


@dataclass
class Completion:
    """A finished request, as the HTTP layer needs it."""

    rid: str
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: dict[str, Any]
    verify_ct: int
    e2e_latency: float
    accepted_drafts: list[int] = field(default_factory=list)  # per verify pass
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
