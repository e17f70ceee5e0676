"""The regen flow: plan, one task per prompts shard (on the config's task runner, ``flows.runners``), finalize.

Servers: ``regen.servers``, or the project's reference server started for the length of the flow (tiny recipe).
``shard_ids`` re-runs only those shards (re-triggers of failed shards). A shard that fails after its retries does
not stop the others; it is listed in ``failed_shards.json`` and in the summary artifact, and the flow then fails
with the re-trigger command (``eagle3.layout.ShardsFailed``, the policy of every sharded stage).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from eagle3.config import PipelineConfig
from eagle3.regen.stage import regen_servers
from flows.runners import shard_runner
from tasks.common import gather_shards
from tasks.regen import finalize_regen_task, plan_regen_task, regen_shard_task


@flow(name="regen", log_prints=False)
def regen_flow(
    config: PipelineConfig, shard_ids: list[int] | None = None, prompts_dir: str | None = None
) -> dict[str, Any]:
    """Regenerate the prompts stage's conversations with the target; returns the stage summary."""
    planned = plan_regen_task(config, prompts_dir, shard_ids)
    plan = planned["plan"]
    with regen_servers(config, log_dir=Path(plan["regen_dir"])) as servers, shard_runner(config, "regen") as runner:
        shared = {"plan": plan, "fingerprint": plan["fingerprint"], "servers": servers}
        futures = {runner.submit(regen_shard_task, shared | {"shard_index": i}): i for i in planned["shard_ids"]}
        _reports, failed = gather_shards(futures)
    return finalize_regen_task(plan, failed)
