"""The regen flow: plan, one task per prompts shard (bounded by the task runner), finalize.

Servers: ``regen.servers``, or the project's reference server started for the length of the flow (tiny recipe).
``shard_ids`` re-runs only those shards (re-triggers of failed shards). A shard that fails after its retries does
not stop the others; it is listed in ``failed_shards.json`` and in the summary artifact, and the flow then fails
with the re-trigger command (``eagle3.layout.ShardsFailed``, the policy of every sharded stage).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from eagle3.config import PipelineConfig
from eagle3.recipes import ConfigRef
from eagle3.regen.stage import regen_servers
from tasks.common import gather_shards, resolve_config_task
from tasks.regen import finalize_regen_task, plan_regen_task, regen_shard_task


@flow(name="regen", log_prints=False, task_runner=ThreadPoolTaskRunner(max_workers=4))
def regen_flow(
    config: PipelineConfig | ConfigRef, shard_ids: list[int] | None = None, prompts_dir: str | None = None
) -> dict[str, Any]:
    """Regenerate the prompts stage's conversations with the target; returns the stage summary. ``config`` is a
    resolved config, or a ``ConfigRef`` (a deployment's) resolved on the worker; ``prompts_dir`` defaults to the
    prompts stage that config names."""
    config = resolve_config_task(config)
    planned = plan_regen_task(config, prompts_dir, shard_ids)
    plan = planned["plan"]
    with regen_servers(config, log_dir=Path(plan["regen_dir"])) as servers:
        futures = {regen_shard_task.submit(plan, plan["fingerprint"], i, servers): i for i in planned["shard_ids"]}
        _reports, failed = gather_shards(futures)
    return finalize_regen_task(plan, failed)
