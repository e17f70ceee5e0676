"""Progress of a regen stage computed from its files alone (usable from another terminal while the
job runs).

Done samples = rows of compacted shards (from their footer stats) + lines of live journals, over the
shards the stage's last run planned (not the whole prompt pool: a night with ``--scale`` runs a
subset). Throughput and ETA come from the journals' finish times over the last ``window_s`` seconds;
right after a restart (or when only compacted shards exist) they are unknown rather than made up.

``waiting_for_servers`` says since when no server has been healthy, and which, while a running shard
waits for one (its ``shard-NNNNN.waiting.json``).

Tokens count the samples still in flight too: a running shard keeps the start times of its samples
in flight (``shard-NNNNN.inflight.json``), and each is credited its elapsed time at the rate its
shard's finished samples were generated (their tokens over their seconds; no credit before one has
finished). Sixteen long answers in flight are then work under way, not nothing: the token rate is
the server's, and the ETA is the tokens left (the samples left at the finished samples' mean, less
what is in flight) over that rate.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3.data.parquet import shard_is_valid
from eagle3.regen.journal import journal_name
from eagle3.regen.schema import REGEN_SCHEMA
from eagle3.regen.shard import (
    IN_FLIGHT_EVERY_S,
    in_flight_name,
    journal_progress,
    read_in_flight,
    read_waiting,
    report_from_shard,
    waiting_name,
)
from eagle3.rundir.layout import PLAN_FILE, find_input, read_failed_shards, shard_name
from eagle3.rundir.runroot import MANIFEST
from eagle3.stage import Progress


@dataclass
class RegenStatus:
    """The shards' states and this run's :class:`~eagle3.stage.Progress` (``progress``: percent,
    rates, ETA)."""

    regen_dir: str
    total: int
    done: int
    tokens: int
    shards_total: int
    shards_done: int
    shards_running: list[int] = field(default_factory=list)
    failed_shards: list[int] = field(default_factory=list)
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    finished: bool = False
    # "waiting for servers for 42s (fails at 300s): <servers, last errors>"
    waiting_for_servers: str | None = None
    tokens_in_flight: int = 0  # estimated tokens of the samples in flight (part of ``tokens``)
    in_flight: int = 0  # samples in flight
    tokens_per_sample: float | None = None  # mean generated tokens of the finished samples

    @property
    def progress(self) -> Progress:
        """While a shard waits for servers: "waiting for servers for 9s (fails at 300s)" instead of
        a rate and an ETA (pre-tokenized samples, which need no request, still finish and would make
        one up)."""
        waiting = self.waiting_for_servers.split(":", 1)[0] if self.waiting_for_servers else None
        return Progress(
            done=self.done,
            total=self.total,
            tokens=self.tokens,
            per_s=self.samples_per_s,
            tokens_per_s=self.tokens_per_s,
            waiting=waiting,
            tokens_in_flight=self.tokens_in_flight,
            tokens_per_item=self.tokens_per_sample,
            in_flight=self.in_flight,
        )

    def to_dict(self) -> dict[str, Any]:
        progress = self.progress
        return asdict(self) | {
            "percent": progress.percent,
            "eta_s": progress.eta_s,
            "eta": progress.eta,
        }


def regen_status(
    regen_dir: Path, *, shard_ids: list[int] | None = None, window_s: float = 300.0
) -> RegenStatus:
    """The status of a planned regen stage directory (``eagle3.lineage`` finds the one a config
    names) over the shards its last run planned (``plan.json``'s units: a night's subset, a
    re-trigger), or only ``shard_ids``."""
    out = find_input(
        Path(regen_dir).parent.parent,
        "regen",
        None,
        explicit=regen_dir,
        option="--run",
        produce="eagle3 regen",
        marker=PLAN_FILE,
    )
    plan = json.loads((out / PLAN_FILE).read_text())
    wanted = set(plan.get("units") or plan["shards"]) if shard_ids is None else set(shard_ids)
    shards = {
        int(k): int(v) for k, v in plan["shards"].items() if int(k) in {int(u) for u in wanted}
    }
    status = RegenStatus(
        regen_dir=str(out),
        total=sum(shards.values()),
        done=0,
        tokens=0,
        shards_total=len(shards),
        shards_done=0,
        failed_shards=read_failed_shards(out),
        finished=(out / MANIFEST).exists(),
    )
    now, recent_samples, recent_tokens = time.time(), 0, 0
    oldest: float | None = None
    for index, rows in sorted(shards.items()):
        shard = out / shard_name(index)
        if shard_is_valid(shard, schema=REGEN_SCHEMA):
            report = report_from_shard(shard, index)
            status.done += rows
            status.tokens += report.completion_tokens
            status.shards_done += 1
            continue
        journal = out / journal_name(index)
        if not journal.exists():
            continue
        status.shards_running.append(index)
        waiting = read_waiting(out / waiting_name(index))
        if waiting is not None:
            status.waiting_for_servers = (
                f"waiting for servers for {now - float(waiting['since']):.0f}s (fails at "
                f"{float(waiting['timeout_s']):g}s): {waiting['servers']}"
            )
        samples, tokens, times, seconds = journal_progress(journal)
        status.done += samples
        status.tokens += tokens
        started = read_in_flight(out / in_flight_name(index), max_age_s=4 * IN_FLIGHT_EVERY_S)
        status.in_flight += len(started)
        if started and seconds > 0:  # credited at this shard's finished samples' rate
            elapsed = sum(max(now - t, 0.0) for t in started)
            status.tokens_in_flight += round(elapsed * tokens / seconds)
        recent = [t for t in times if t >= now - window_s]
        if recent:
            recent_samples += len(recent)
            recent_tokens += round(tokens * len(recent) / max(samples, 1))
            oldest = min(oldest, min(recent)) if oldest is not None else min(recent)
    if oldest is not None and now > oldest and recent_samples > 1:
        span = now - oldest
        status.samples_per_s = recent_samples / span
        status.tokens_per_s = recent_tokens / span
    if status.done:
        status.tokens_per_sample = status.tokens / status.done
    status.tokens += status.tokens_in_flight
    return status
