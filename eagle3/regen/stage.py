"""The whole regen stage: servers for the run, finalization (manifest, failed shards), and a library runner.

``regen_servers`` yields the configured server URLs, or starts the project's reference server on the target
model for the length of the block when ``regen.servers`` is empty (the tiny recipe). ``finalize_regen`` writes
``failed_shards.json`` (empty list when none) every time and ``manifest.json`` only when every shard is compacted.
``run_regen`` runs the stage in one process (``regen.shards_in_flight`` shards at once on one event loop); the
Prefect flow does the same with one task per shard.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eagle3.config import PipelineConfig
from eagle3.data.parquet import shard_is_valid
from eagle3.layout import shard_name, write_failed_shards
from eagle3.regen.client import sampling_params
from eagle3.regen.plan import RegenPlan, plan_regen, sampling_fields, target_fields
from eagle3.regen.schema import REGEN_SCHEMA
from eagle3.regen.shard import OnResult, ShardFailed, ShardReport, regen_shard_async, report_from_shard
from eagle3.runroot import FileEntry, Manifest

logger = logging.getLogger(__name__)

STAGE = "regen"
REPORT_FIELDS = (
    "ok",
    "truncated",
    "dropped",
    "failed",
    "pretokenized",
    "completion_tokens",
    "round_trip_failures",
    "mask_fallbacks",
)


@contextmanager
def regen_servers(config: PipelineConfig, *, log_dir: Path | None = None) -> Iterator[list[str]]:
    """The servers to regenerate with: ``regen.servers``, or a local reference server started for the block."""
    if config.regen.servers:
        yield list(config.regen.servers)
        return
    from eagle3.serve.launch import reference_server

    extra = ["--max-running-requests", str(config.regen.concurrency_per_server), "--dtype", config.target.dtype]
    if config.server.context_length or config.target.context_length:
        extra += ["--context-length", str(config.server.context_length or config.target.context_length)]
    log_path = (log_dir / "reference-server.log") if log_dir else None
    with reference_server(config.target.model_path, extra_args=extra, log_path=log_path) as server:
        yield [server.url]


def finalize_regen(plan: RegenPlan, failed_shards: list[int]) -> dict[str, Any]:
    """Write ``failed_shards.json`` and, when every shard is compacted, ``manifest.json``; return a summary."""
    out = Path(plan.regen_dir)
    write_failed_shards(out, failed_shards)
    reports, files, pending = [], [], []
    for index in sorted(plan.shards):
        path = out / shard_name(index)
        if not shard_is_valid(path, schema=REGEN_SCHEMA):
            pending.append(index)
            continue
        report = report_from_shard(path, index)
        reports.append(report)
        files.append(FileEntry.of(path, rows=report.rows, base=out))
        failed_path = out / shard_name(index, "failed")
        if failed_path.exists():
            files.append(FileEntry.of(failed_path, rows=report.failed, base=out))
    stats: dict[str, Any] = {k: sum(getattr(r, k) for r in reports) for k in REPORT_FIELDS}
    stats |= {"shards_done": len(reports), "shards_pending": pending, "failed_shards": sorted(set(failed_shards))}
    done = not pending
    if done:
        config = plan.pipeline
        Manifest(
            stage=STAGE,
            fingerprint=plan.fingerprint,
            files=files,
            config={
                "sampling": sampling_fields(config.regen),
                "sampling_params": sampling_params(config.regen),
                "target": target_fields(config),
                "prompts_dir": plan.prompts_dir,
                "prompts_fingerprint": plan.prompts_fingerprint,
                "servers": list(config.regen.servers) or ["<local reference server>"],
            },
            stats=stats,
        ).write(out)
    return {"regen_dir": str(out), "fingerprint": plan.fingerprint, "done": done, **stats}


async def _run_shards(
    plan: RegenPlan, shard_ids: list[int], servers: list[str], workers: int, on_result: OnResult | None
) -> tuple[list[ShardReport], list[int]]:
    gate = asyncio.Semaphore(workers)
    reports: list[ShardReport] = []
    failed: list[int] = []

    async def one(index: int) -> None:
        async with gate:
            try:
                reports.append(await regen_shard_async(plan, index, servers, on_result=on_result))
            except ShardFailed as exc:
                logger.error("%s", exc)
                failed.append(index)

    await asyncio.gather(*(one(i) for i in shard_ids))
    return reports, failed


def run_regen(
    config: PipelineConfig,
    *,
    prompts_dir: Path,
    shard_ids: list[int] | None = None,
    on_result: OnResult | None = None,
) -> dict[str, Any]:
    """Run the regen stage in this process (no Prefect): plan, servers, shards, finalize."""
    plan = plan_regen(config, prompts_dir)
    selected = plan.select(shard_ids)
    with regen_servers(config, log_dir=Path(plan.regen_dir)) as servers:
        workers = config.regen.shards_in_flight
        _reports, failed = asyncio.run(_run_shards(plan, selected, servers, workers, on_result))
    return finalize_regen(plan, failed)


def shard_states(plan: RegenPlan, failed_shards: list[int]) -> list[dict[str, Any]]:
    """One row per shard (for the Prefect table artifact): state, rows, outcome counts, generated tokens."""
    out = Path(plan.regen_dir)
    table = []
    for index in sorted(plan.shards):
        path = out / shard_name(index)
        row: dict[str, Any] = {"shard": index, "prompts": plan.shards[index]}
        if shard_is_valid(path, schema=REGEN_SCHEMA):
            report = report_from_shard(path, index)
            row |= {"state": "done"} | {k: getattr(report, k) for k in REPORT_FIELDS}
        else:
            row["state"] = "failed" if index in failed_shards else "pending"
        table.append(row)
    return table
