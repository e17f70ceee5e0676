"""Prefect tasks of the regen stage: plan, one task per shard, finalize (manifest, tables, summary).

A shard task resumes itself from its journal; the Prefect cache (stage fingerprint + shard index) only skips
shards already done in an earlier flow run. ``retries=2`` re-enters the library shard function, which picks up
after the samples already journaled. Progress: every finished sample updates one progress artifact per flow run
(percent, tok/s, ETA; throttled by ``Progress``), shared by the shard tasks running in this process's threads.
"""

from __future__ import annotations

import logging
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency
from prefect.context import TaskRunContext
from prefect.exceptions import MissingContextError
from prefect.runtime import flow_run

from eagle3.config import PipelineConfig
from eagle3.layout import ShardsFailed, shard_name
from eagle3.lineage import Lineage
from eagle3.regen.plan import RegenPlan, plan_regen
from eagle3.regen.shard import regen_shard
from eagle3.regen.stage import finalize_regen, shard_states
from eagle3.regen.status import regen_status
from tasks.common import (
    Progress,
    artifact_key,
    cache_key_from,
    output_cache_key,
    publish_markdown,
    publish_table,
)

PROGRESS_EVERY_S = 10.0


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The run logger inside a flow or task run; the module logger when called as ``task.fn`` (tests)."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


class _StageProgress:
    """Samples and tokens finished in this flow run, on top of what the stage dir already held at start."""

    def __init__(self, plan: RegenPlan, every_s: float) -> None:
        status = regen_status(plan.regen_dir)
        self.lock = threading.Lock()
        self.done, self.tokens = status.done, 0
        self.progress = Progress(
            artifact_key("regen-progress", plan.fingerprint),
            total=plan.total,
            unit="samples",
            every_s=every_s,
            already_done=self.done,
        )

    def on_result(self, row: dict[str, Any]) -> None:
        with self.lock:
            self.done += 1
            self.tokens += int(row.get("completion_tokens") or 0)
            self.progress.update(self.done, tokens=self.tokens)


_PROGRESS: dict[tuple[str, str], _StageProgress] = {}
_PROGRESS_LOCK = threading.Lock()


def stage_progress(plan: RegenPlan) -> _StageProgress:
    """The progress tracker of this flow run and stage (created by the first shard task that asks)."""
    key = (str(flow_run.get_id()), plan.fingerprint)
    with _PROGRESS_LOCK:
        if key not in _PROGRESS:
            every_s = min(PROGRESS_EVERY_S, plan.pipeline.orchestration.progress_every_s)
            _PROGRESS[key] = _StageProgress(plan, every_s)
        return _PROGRESS[key]


_SHARD_SLOTS: dict[str, threading.BoundedSemaphore] = {}


def shard_slot(plan: RegenPlan) -> threading.BoundedSemaphore:
    """``regen.shards_in_flight`` slots per flow run: shard tasks beyond them wait in their worker thread."""
    key = str(flow_run.get_id())
    with _PROGRESS_LOCK:
        if key not in _SHARD_SLOTS:
            _SHARD_SLOTS[key] = threading.BoundedSemaphore(plan.pipeline.regen.shards_in_flight)
        return _SHARD_SLOTS[key]


def server_limit_names(servers: list[str]) -> list[str]:
    """Prefect global concurrency limit names, one per server (create them to cap shards per server)."""
    return [artifact_key("regen-server", url.split("://", 1)[-1]) for url in servers]


@task(name="regen-plan", cache_policy=NO_CACHE)
def plan_regen_task(
    config: PipelineConfig, prompts_dir: str | None = None, shard_ids: list[int] | None = None
) -> dict[str, Any]:
    """Plan the stage over ``prompts_dir`` (default: the prompts stage this config names); returns the plan (a dict)
    and the shard ids to run."""
    plan = plan_regen(config, Lineage(config).input("normalize", Path(prompts_dir) if prompts_dir else None))
    selected = plan.select(shard_ids)
    _logger().info(
        "regen %s: %d prompts in %d shards, running %s", plan.fingerprint, plan.total, len(plan.shards), selected
    )
    return {"plan": plan.to_dict(), "shard_ids": selected}


def _shard_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    """Fingerprint + shard index + the compacted shard's size and mtime (never cached while it is missing)."""
    output = Path(parameters["plan"]["regen_dir"]) / shard_name(int(parameters["shard_index"]))
    return output_cache_key(cache_key_from("fingerprint", "shard_index")(context, parameters), output)


@task(name="regen-shard", retries=2, retry_delay_seconds=10, cache_key_fn=_shard_cache_key, persist_result=True)
def regen_shard_task(plan: dict[str, Any], fingerprint: str, shard_index: int, servers: list[str]) -> dict[str, Any]:
    """Regenerate one shard (resuming from its journal); returns its report."""
    regen_plan = RegenPlan.from_dict(plan)
    tracker = stage_progress(regen_plan)
    # Limits cap shards per persistent server across flow runs (nightly + a re-trigger); a reference server started
    # by this flow run has a fresh port and no other user, so it has none.
    limits = server_limit_names(regen_plan.pipeline.regen.servers)
    with shard_slot(regen_plan), concurrency(limits, occupy=1, strict=False) if limits else nullcontext():
        report = regen_shard(regen_plan, shard_index, servers, on_result=tracker.on_result)
    _logger().info("regen shard %d %s: %s", shard_index, report.state, report.to_dict())
    return report.to_dict()


@task(name="regen-finalize", cache_policy=NO_CACHE)
def finalize_regen_task(plan: dict[str, Any], failed_shards: list[int]) -> dict[str, Any]:
    """Write failed_shards.json (+ manifest when complete), publish the shard table and the summary; raise
    ``ShardsFailed`` (with the re-trigger command) when any shard failed."""
    regen_plan = RegenPlan.from_dict(plan)
    summary = finalize_regen(regen_plan, failed_shards)
    table = shard_states(regen_plan, failed_shards)
    publish_table(artifact_key("regen-shards", regen_plan.fingerprint), table, description="regen shard states")
    status = regen_status(regen_plan.regen_dir)
    stage_progress(regen_plan).progress.update(status.done, force=True)
    failed = summary["failed_shards"]
    lines = [
        f"# regen {regen_plan.fingerprint}",
        f"- stage dir: `{summary['regen_dir']}`",
        f"- done: {summary['done']} ({status.done}/{status.total} samples, {summary['shards_done']} shards)",
        f"- ok {summary['ok']}, truncated {summary['truncated']}, dropped {summary['dropped']}, "
        f"failed samples {summary['failed']}, round-trip failures {summary['round_trip_failures']}",
        f"- failed shards: {failed or 'none'}"
        + (f" (re-run: `eagle3 retry-shards --run {summary['regen_dir']} --failed`)" if failed else ""),
    ]
    publish_markdown(artifact_key("regen-summary"), "\n".join(lines), description="regen summary")
    if failed:
        raise ShardsFailed("regen", summary["regen_dir"], failed, f"eagle3 retry-shards --run {summary['regen_dir']} "
                           f"--failed (or the regen deployment with shard_ids={failed})")
    return summary
