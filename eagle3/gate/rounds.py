"""Interleaved, repeated measurement of the gate's arms (docs/DESIGN.md, "The gate"): the rounds
``eagle3.gate.verdict`` decides on.

Design choices:
- Every arm is up at once (launched by the gate, or given as URLs) and the gate alternates the
  traffic, not the launches: relaunching a server per round would cost a model load each time
  (seconds here, minutes for SGLang) and measure a cold server. The arms take turns, so they never
  share the machine while timed.
- Rounds over the whole traffic profile: in round r, at each level of ``gate.traffic`` (ascending
  concurrency), every live arm gets the same prompts once, in arm order on even rounds and reversed
  on odd ones (baseline, candidate | candidate, baseline | ...), so a drift of the machine falls on
  both sides of a pair of rounds instead of always on the arm measured second. Every level is in
  every round, so the verdict can combine the levels per round (``eagle3.gate.stats``) and a round's
  machine state is shared by all its levels.
- An arm's batch in a round: ``gate.warmup_requests`` untimed requests, a prefix-cache flush (a
  refusal is recorded in ``ArmResult.flush_failures``, the batch still runs: the numbers stay real),
  then every prompt at the level's concurrency, timed. Any failed timed request takes the arm out
  (``ArmResult.error``); the others go on.
- ``gate.min_rounds`` rounds, then one more at a time while ``keep_going()`` up to
  ``gate.max_rounds`` (``eagle3.gate.verdict.undecided``: a FAIL or a failed sanity check stops
  early, a PASS never does). A round costs levels x arms timed batches. Stopping on a FAIL as soon
  as its interval allows is a sequential test: its false-FAIL rate is somewhat above ``(1 -
  confidence) / 2``; ``min_rounds`` limits how early it can stop.
- Each request's prompt set is kept, so every round also carries accept length per set
  (``LevelStats.by_set``).
- Sampling: a measurement is at one ``gate.sampling`` profile; each request sends its set's sampling
  and, when it samples, a ``sampling_seed`` from the profile, the prompt and the round
  (``SamplingProfile.request_seed``): every arm gets the same seeds, each round new ones (so the
  rounds average over samples, not one sample timed again), and a server that honours seeds answers
  a re-run with the same tokens.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from eagle3.config.gate import GateConfig
from eagle3.config.sampling import SamplingProfile
from eagle3.gate.prompts import BenchPrompt, send_prompts_async
from eagle3.gate.report import ArmResult, LevelStats
from eagle3.runtime.stop import raise_if_stopped

logger = logging.getLogger(__name__)

FLUSH_ATTEMPTS = 5
FLUSH_WAIT_S = 0.5


class ArmError(RuntimeError):
    """An arm could not be measured (launch, preflight or request failures); the message says
    which."""


def flush_cache(
    url: str, *, attempts: int = FLUSH_ATTEMPTS, wait_s: float = FLUSH_WAIT_S
) -> str | None:
    """POST ``/flush_cache``; ``None`` once flushed, else why it could not be.

    SGLang refuses to flush while requests are running or waiting (400; sgl-project/sglang
    ``python/sglang/srt/entrypoints/http_server.py`` ``flush_cache``). Right after a batch the last
    replies may still be leaving the server, so a 400 is retried a few times. Not flushing does not
    fail the arm (the numbers stay real, a warm prefix cache only flatters the next batch), so the
    caller records it in the report instead.
    """
    last = "no attempt made"
    for attempt in range(attempts):
        if attempt:
            time.sleep(wait_s)
        try:
            with urllib.request.urlopen(
                urllib.request.Request(f"{url}/flush_cache", method="POST"), timeout=30
            ):
                return None
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read().decode(errors='replace').strip()}"
            if exc.code != 400:
                break
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
            break
    return f"could not flush the cache at {url} after {attempt + 1} attempts: {last}"


@dataclass(frozen=True)
class Batch:
    """What every arm's turn sends: ``(prompt_id, input_ids)`` pairs and each one's prompt set, in
    order, at one sampling profile."""

    pairs: list[tuple[str, list[int]]]
    sets: list[str]
    profile: SamplingProfile = field(default_factory=SamplingProfile)

    @classmethod
    def of(cls, prompts: list[BenchPrompt], profile: SamplingProfile | None = None) -> Batch:
        pairs = [(p.prompt_id, list(p.input_ids)) for p in prompts]
        return cls(pairs, [p.set_name for p in prompts], profile or SamplingProfile())

    def sampling(self, round_: int, n: int | None = None) -> list[dict[str, object]]:
        """The ``sampling_params`` fields of the first ``n`` requests (all by default) in round
        ``round_``."""
        out = []
        for (pid, _), name in list(zip(self.pairs, self.sets, strict=True))[:n]:
            params = self.profile.for_set(name)
            seed = self.profile.request_seed(pid, round_)
            out.append(params.request() | ({} if params.greedy else {"sampling_seed": seed}))
        return out


async def _batch(arm: ArmResult, url: str, batch: Batch, c: int, r: int, gate: GateConfig) -> None:
    """One arm's turn in one round: warm-up, flush, then every prompt at concurrency ``c`` into
    ``arm.rounds``."""
    pairs = batch.pairs
    if gate.warmup_requests:
        warm = pairs[: gate.warmup_requests]
        await send_prompts_async(
            url,
            warm,
            concurrency=len(warm),
            max_new_tokens=gate.max_new_tokens,
            sampling=batch.sampling(r, len(warm)),
        )
    failure = await asyncio.to_thread(flush_cache, url)
    if failure:
        logger.warning("%s before concurrency %d round %d: %s", arm.name, c, r, failure)
        arm.flush_failures.append(f"concurrency {c} round {r}: {failure}")
    sent = await send_prompts_async(
        url, pairs, concurrency=c, max_new_tokens=gate.max_new_tokens, sampling=batch.sampling(r)
    )
    errors = [res.error for res in sent.results if res.error]
    if errors:
        raise ArmError(
            f"{len(errors)}/{len(pairs)} requests failed at concurrency {c}, first: {errors[0]}"
        )
    stats = LevelStats.of(c, sent.results, sent.duration_s, sets=batch.sets)
    stats.round = r
    arm.rounds.append(stats)
    logger.info("%s concurrency %d round %d: %.1f tok/s", arm.name, c, r, stats.output_tok_s)


async def _level(
    live: list[tuple[ArmResult, str]], batch: Batch, c: int, r: int, gate: GateConfig
) -> None:
    """Round ``r`` at concurrency ``c``: each arm still up takes its turn, in arm order on even
    rounds and reversed on odd ones."""
    order = live if r % 2 == 0 else live[::-1]
    for arm, url in order:
        if arm.error is not None:
            continue
        try:
            await _batch(arm, url, batch, c, r, gate)
        except ArmError as exc:
            arm.error = str(exc)
            logger.error("arm %s failed: %s", arm.name, exc)


def measure_rounds(
    live: list[tuple[ArmResult, str]],
    prompts: list[BenchPrompt],
    gate: GateConfig,
    *,
    keep_going: Callable[[], bool],
    profile: SamplingProfile | None = None,
) -> None:
    """Measure every ``(arm, url)`` in interleaved rounds, each over every level of
    ``gate.traffic``, at sampling ``profile`` (default greedy); ``keep_going`` says after each round
    past ``min_rounds`` whether the verdict is still open. Fills ``arm.rounds`` and, pooled,
    ``arm.levels``."""
    batch = Batch.of(prompts, profile)

    async def run() -> None:
        for r in range(gate.max_rounds):
            if r >= gate.min_rounds and not keep_going():
                break
            for c in gate.levels:
                raise_if_stopped(f"the gate's round {r + 1}")
                if any(arm.role == "baseline" and arm.error for arm, _ in live):
                    return  # nothing left to compare against
                await _level(live, batch, c, r, gate)
            for arm, _ in live:
                arm.pool()  # keep_going decides from the rounds so far

    asyncio.run(run())
