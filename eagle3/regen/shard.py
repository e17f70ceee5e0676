"""Regenerate one prompts shard: resume from its journal, fan out requests, compact into Parquet.

A shard is done when ``shard-NNNNN.parquet`` (written last, via the shared ``ShardWriter``: tmp +
rename) is valid; its journal is then removed. Resume = skip every sample id already in the journal
and replay the journaled turns of unfinished multi-turn samples. The number of samples in flight is
bounded by the pool's capacity (``concurrency_per_server * servers``), so memory does not grow with
the shard. When a sample exhausts its retries or no server has been healthy for
``regen.no_server_timeout_s``, no new samples start, those in flight are cancelled (what finished is
journaled) and ``ShardFailed`` is raised with that one line: the shard fails alone and a re-run
picks up where it stopped. While no server is healthy, ``shard-NNNNN.waiting.json`` says since when
and why (``regen status`` and the progress bar show "waiting for servers"); it is removed when one
is back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.data.dialect import reasoning_format, tool_call_format
from eagle3.data.parquet import (
    ShardWriter,
    iter_batches,
    shard_is_valid,
    shard_metadata,
    write_table,
)
from eagle3.data.template import TemplateError, template_hash
from eagle3.regen.client import Client, RetriesExhausted
from eagle3.regen.conversation import (
    SERVED_PREFIX,
    SampleContext,
    failed_row,
    pretokenized_row,
    regenerate,
    source_row,
)
from eagle3.regen.journal import TIME_KEY, Journal, journal_name, read_journal
from eagle3.regen.plan import RegenPlan, template_kwargs
from eagle3.regen.pool import NoServerAvailable, ServerPool, shared_pool
from eagle3.regen.schema import (
    PROMPT_COLUMNS,
    REGEN_COLUMNS,
    REGEN_SCHEMA,
    STATUS_FAILED,
    STATUS_TRUNCATED,
)
from eagle3.regen.stop import running_shard
from eagle3.rundir.integrity import verify_files
from eagle3.rundir.layout import shard_name
from eagle3.rundir.runroot import MANIFEST, atomic_write_text
from eagle3.target_io import load_tokenizer

logger = logging.getLogger(__name__)

STATS_KEY = "regen_stats"
IN_FLIGHT_EVERY_S = 5.0  # how often a running shard rewrites its in-flight marker
# The side files of a compacted shard: rows that exhausted their retries, and truncated rows that
# ``regen.keep_truncated=false`` keeps out of training (kept here, with their ids and text, for
# inspection).
FAILED, DROPPED = "failed", "dropped"
OnResult = Callable[[dict[str, Any]], None]


class ShardFailed(RuntimeError):
    """A shard stopped because requests exhausted their retries or no server was healthy; what
    succeeded is journaled."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(f"regen shard {index} failed: {message}")
        self.index = index


@dataclass
class ShardReport:
    index: int
    state: str  # done | skipped (already compacted)
    rows: int = 0
    ok: int = 0
    truncated: int = 0
    dropped: int = 0
    failed: int = 0
    pretokenized: int = 0
    served: int = 0  # rows the target answered in service (eagle3.data.served): passed through
    completion_tokens: int = 0
    round_trip_failures: int = 0
    mask_fallbacks: int = 0
    # rows whose last prompt shows earlier turns by the template's rule, not as generated
    history_rewritten: int = 0
    # rows that ended where the target's calls did not match the source's results
    tool_replay_stops: int = 0
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def regen_shard(
    config: PipelineConfig,
    plan: RegenPlan,
    index: int,
    servers: list[str],
    *,
    on_result: OnResult | None = None,
) -> ShardReport:
    """Run (or resume, or skip) one shard to completion; raises ``ShardFailed`` when servers are
    gone."""
    return asyncio.run(regen_shard_async(config, plan, index, servers, on_result=on_result))


async def regen_shard_async(
    config: PipelineConfig,
    plan: RegenPlan,
    index: int,
    servers: list[str],
    *,
    on_result: OnResult | None = None,
) -> ShardReport:
    out = plan.out_dir
    shard_path = out / shard_name(index)
    if shard_is_valid(shard_path, schema=REGEN_SCHEMA):
        (out / journal_name(index)).unlink(missing_ok=True)
        return report_from_shard(shard_path, index)
    # damaged prompts never reach the target; normalize redoes all or nothing
    prompts = plan.prompt_shard(index)
    verify_files([prompts], rebuild=f"rm {prompts.parent / MANIFEST} && eagle3 normalize")
    cfg, start = config.regen, time.monotonic()
    tokenizer = load_tokenizer(config.target)
    if cfg.answers == "source":
        return _source_shard(config, plan, index, tokenizer, on_result, start)
    if not servers:  # the stage started none: every row passes through (RegenStage.resources)
        journal = Journal(out / journal_name(index), fsync_every=cfg.journal_fsync_every)
        with running_shard(index), journal:
            _pass_through(_prompt_rows(plan, index, set(journal.done)), journal, index, on_result)
        return compact_shard(config, plan, index, template=template_hash(tokenizer))
    pool = shared_pool(servers, cfg)
    api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    with (
        running_shard(index),
        Journal(out / journal_name(index), fsync_every=cfg.journal_fsync_every) as journal,
    ):
        rows = _prompt_rows(plan, index, set(journal.done))
        context = config.server.context_length or config.target.context_length
        async with Client(cfg, pool, api_key=api_key, seed=index, context_length=context) as client:
            ctx = sample_context(config, tokenizer, client, on_turn=journal.append)
            starts: dict[str, float] = {}  # sample id -> wall time it was sent, while in flight
            watchers = [
                asyncio.ensure_future(_mark_outages(pool, out / waiting_name(index))),
                asyncio.ensure_future(_mark_in_flight(starts, out / in_flight_name(index))),
            ]
            try:
                error = await _run_samples(ctx, rows, journal, pool.capacity, on_result, starts)
            finally:
                for watcher in watchers:
                    watcher.cancel()
                await asyncio.gather(*watchers, return_exceptions=True)
    if error is not None:
        raise ShardFailed(index, error)
    report = compact_shard(config, plan, index, template=template_hash(tokenizer))
    report.elapsed_s = time.monotonic() - start
    return report


def _pass_through(
    rows: Iterator[dict[str, Any]], journal: Journal, index: int, on_result: OnResult | None
) -> None:
    """Journal the rows of a shard that needs no server (served and pre-tokenized rows)."""
    for row in rows:
        if row.get("input_ids") is None:
            missing = f"sample {row['sample_id']} needs generation but no server was started"
            raise ShardFailed(index, missing)
        result = pretokenized_row(row)
        journal.append(result)
        if on_result is not None:
            on_result(result)


def sample_context(
    config: PipelineConfig, tokenizer: Any, client: Client, **kwargs: Any
) -> SampleContext:
    """What every sample of the stage shares, from the config (api, dialect, the template's
    arguments)."""
    cfg = config.regen
    return SampleContext(
        tokenizer,
        client,
        cfg.api,
        config.target.model_path,
        tokenizer.eos_token_id,
        reasoning=reasoning_format(cfg.reasoning_parser) if cfg.reasoning_parser else None,
        calls=tool_call_format(cfg.tool_call_parser) if cfg.tool_call_parser else None,
        template_kwargs=template_kwargs(cfg),
        max_turns=cfg.max_turns,
        **kwargs,
    )


def _source_shard(
    config: PipelineConfig,
    plan: RegenPlan,
    index: int,
    tokenizer: Any,
    on_result: OnResult | None,
    start: float,
) -> ShardReport:
    """``regen.answers=source``: every row with the dataset's own answers (``source_row``), no
    server."""
    out = plan.out_dir
    fsync_every = config.regen.journal_fsync_every
    with Journal(out / journal_name(index), fsync_every=fsync_every) as journal:
        for row in _prompt_rows(plan, index, set(journal.done)):
            result = source_row(tokenizer, row, max_turns=config.regen.max_turns)
            journal.append(result)
            if on_result is not None:
                on_result(result)
    report = compact_shard(config, plan, index, template=template_hash(tokenizer))
    report.elapsed_s = time.monotonic() - start
    return report


def waiting_name(index: int) -> str:
    """The marker a shard keeps while no server is healthy (see module docstring)."""
    return f"shard-{index:05d}.waiting.json"


def read_waiting(path: Path) -> dict[str, Any] | None:
    """A shard's waiting marker (``since``, ``timeout_s``, ``servers``), or None when it is not
    waiting."""
    try:
        return json.loads(path.read_text())
    # not waiting, or caught between write and rename
    except (FileNotFoundError, json.JSONDecodeError):
        return None


async def _mark_outages(pool: ServerPool, marker: Path) -> None:
    """Keep ``marker`` in step with the pool's outage (checked every second) until cancelled, then
    remove it."""
    shown: dict[str, object] | None = None
    try:
        while True:
            outage = pool.outage()
            if outage != shown:
                if outage is None:
                    marker.unlink(missing_ok=True)
                else:
                    atomic_write_text(marker, json.dumps(outage))
                shown = outage
            await asyncio.sleep(1.0)
    finally:
        marker.unlink(missing_ok=True)


def in_flight_name(index: int) -> str:
    """The marker a running shard keeps of the samples in flight: ``{"at", "started"}`` (wall
    times)."""
    return f"shard-{index:05d}.inflight.json"


def read_in_flight(path: Path, *, max_age_s: float) -> list[float]:
    """The start times of a running shard's samples in flight; none when its marker is missing or
    older than ``max_age_s`` (a shard that stopped without removing it)."""
    try:
        marker = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    return [float(t) for t in marker["started"]] if time.time() - marker["at"] <= max_age_s else []


async def _mark_in_flight(starts: dict[str, float], marker: Path) -> None:
    """Write ``marker`` every ``IN_FLIGHT_EVERY_S`` until cancelled, then remove it: what ``regen
    status`` needs to count the tokens of samples still running (a long answer is work done before
    it finishes)."""
    try:
        while True:
            state = {"at": time.time(), "started": sorted(starts.values())}
            atomic_write_text(marker, json.dumps(state))
            await asyncio.sleep(IN_FLIGHT_EVERY_S)
    finally:
        marker.unlink(missing_ok=True)


def _prompt_rows(plan: RegenPlan, index: int, skip: set[str]) -> Iterator[dict[str, Any]]:
    for batch in iter_batches(
        plan.prompt_shard(index), columns=list(PROMPT_COLUMNS), batch_size=256
    ):
        for row in batch.to_pylist():
            if row["sample_id"] not in skip:
                yield row


async def _run_samples(
    ctx: SampleContext,
    rows: Iterator[dict[str, Any]],
    journal: Journal,
    capacity: int,
    on_result: OnResult | None,
    starts: dict[str, float] | None = None,
) -> str | None:
    """Regenerate ``rows`` with at most ``capacity`` in flight; returns the error that stopped the
    shard, if any. Samples still in flight when it stops (a failure, a cancellation) are cancelled
    before the journal closes."""
    slots = asyncio.Semaphore(capacity)
    failure: list[str] = []
    tasks: set[asyncio.Task[None]] = set()

    started = {} if starts is None else starts

    async def one(row: dict[str, Any]) -> None:
        started[row["sample_id"]] = time.time()
        try:
            result = await regenerate(ctx, row, journal.turns.pop(row["sample_id"], None))
        except (RetriesExhausted, NoServerAvailable) as exc:
            failure.append(str(exc))
            return
        except TemplateError as exc:
            result = failed_row(row, f"cannot render the conversation: {exc}", attempts=0)
        finally:
            slots.release()
            started.pop(row["sample_id"], None)
        journal.append(result)
        if on_result is not None:
            on_result(result)

    try:
        for row in rows:
            await slots.acquire()
            if failure:
                break
            task = asyncio.ensure_future(one(row))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks and not failure:
            await asyncio.wait(list(tasks), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return failure[0] if failure else None


def _stats(
    kept: list[dict[str, Any]], failed: list[dict[str, Any]], dropped: int
) -> dict[str, int]:
    metas = [json.loads(r["meta"]) for r in kept]
    return {
        "rows": len(kept),
        "ok": sum(r["status"] != STATUS_TRUNCATED for r in kept),
        "truncated": sum(r["status"] == STATUS_TRUNCATED for r in kept),
        "dropped": dropped,
        "failed": len(failed),
        "pretokenized": sum(r["server"] == "pretokenized" for r in kept),
        "served": sum(str(r["server"]).startswith(SERVED_PREFIX) for r in kept),
        "completion_tokens": sum(int(m.get("total_completion_tokens", 0)) for m in metas),
        "round_trip_failures": sum(not m.get("round_trip", True) for m in metas),
        "mask_fallbacks": sum(bool(m.get("mask_fallback")) for m in metas),
        "history_rewritten": sum(m.get("history") == "template" for m in metas),
        "tool_replay_stops": sum(bool(m.get("stopped")) for m in metas),
    }


def compact_shard(
    config: PipelineConfig, plan: RegenPlan, index: int, *, template: str
) -> ShardReport:
    """Journal -> ``shard-NNNNN.parquet`` (in prompts order), plus ``failed-NNNNN.parquet`` and
    ``dropped-NNNNN.parquet`` when any rows failed or were dropped as truncated."""
    out = plan.out_dir
    journal_path = out / journal_name(index)
    by_id: dict[str, dict[str, Any]] = {}
    for row in read_journal(journal_path):
        # first result wins
        by_id.setdefault(row["sample_id"], {k: row.get(k) for k in REGEN_COLUMNS})
    order = [
        r["sample_id"]
        for b in iter_batches(plan.prompt_shard(index), columns=["sample_id"])
        for r in b.to_pylist()
    ]
    missing = [sid for sid in order if sid not in by_id]
    if missing:
        raise RuntimeError(
            f"shard {index}: {len(missing)} samples have no journal line (e.g. {missing[:3]})"
        )
    rows = [by_id[sid] for sid in dict.fromkeys(order)]
    set_aside = (
        {STATUS_FAILED} if config.regen.keep_truncated else {STATUS_FAILED, STATUS_TRUNCATED}
    )
    failed = [r for r in rows if r["status"] == STATUS_FAILED]
    dropped = [r for r in rows if r["status"] == STATUS_TRUNCATED and r["status"] in set_aside]
    kept = [r for r in rows if r["status"] not in set_aside]
    stats = _stats(kept, failed, dropped=len(dropped))
    meta = {
        STATS_KEY: json.dumps(stats),
        "regen_fingerprint": plan.fingerprint,
        "target_model": config.target.model_path,
        "chat_template_hash": template,
        "chat_template_kwargs": json.dumps(template_kwargs(config.regen)),
    }
    # never silent loss: set-aside rows keep their text
    for kind, side in ((DROPPED, dropped), (FAILED, failed)):
        if side:
            with ShardWriter(
                out, REGEN_SCHEMA, prefix=kind, start_index=index, metadata=meta
            ) as writer:
                writer.write_rows(side)
    if kept:
        with ShardWriter(
            out, REGEN_SCHEMA, prefix="shard", start_index=index, metadata=meta
        ) as writer:
            writer.write_rows(kept)
    else:  # every sample failed or was dropped: an empty shard still marks the shard done
        write_table(out / shard_name(index), REGEN_SCHEMA.empty_table(), metadata=meta)
    journal_path.unlink(missing_ok=True)
    logger.info("regen shard %d compacted: %s", index, stats)
    return ShardReport(index=index, state="done", **stats)


def report_from_shard(path: Path, index: int) -> ShardReport:
    stats = json.loads(shard_metadata(path).get(STATS_KEY, "{}"))
    return ShardReport(index=index, state="skipped", **stats)


def journal_progress(path: Path) -> tuple[int, int, list[float], float]:
    """(samples, generated tokens, finish times, seconds the samples took) of a live journal; for
    status and progress."""
    rows = read_journal(path)
    tokens = sum(
        int(json.loads(r.get("meta") or "{}").get("total_completion_tokens", 0)) for r in rows
    )
    answered = [r for r in rows if r.get("status") != STATUS_FAILED]
    seconds = sum(float(r.get("latency_s") or 0.0) for r in answered)
    return len(rows), tokens, [float(r.get(TIME_KEY, 0.0)) for r in rows], seconds
