"""The regen flow: the one stage wiring (``flows.stage.run_stage``) over the regen stage
(``eagle3.regen.stage``).

Servers: ``regen.servers``, or the project's reference server started for the length of the flow
(tiny recipe). ``shard_ids`` re-runs only those shards (re-triggers of failed shards). A shard that
fails after its retries does not stop the others; it is listed in ``failed_shards.json`` and in the
summary artifact, and the flow then fails with the re-trigger command (the policy of every stage).
The ``regen`` deployment passes a ``ConfigRef``, resolved here on the worker at run time.
"""

from __future__ import annotations

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from eagle3.config.pipeline import PipelineConfig
from eagle3.recipes import ConfigRef
from eagle3.regen.stage import RegenStage
from eagle3.stage import StageResult
from flows.stage import run_stage
from tasks.common import resolve_config_task


@flow(name="regen", log_prints=False, task_runner=ThreadPoolTaskRunner(max_workers=4))
def regen_flow(
    config: PipelineConfig | ConfigRef,
    shard_ids: list[int] | None = None,
    prompts_dir: str | None = None,
) -> StageResult:
    """Regenerate the prompts stage's conversations with the target; returns the stage result.
    ``prompts_dir`` defaults to the prompts stage the config names."""
    resolved = resolve_config_task(config)
    return run_stage(RegenStage(), resolved, prompts_dir=prompts_dir, shard_ids=shard_ids)
