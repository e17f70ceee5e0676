"""``normalize``: one task per source (its normalized spill), then one dedup + shard task (DESIGN §3, §7).

The per-source tasks run concurrently on the flow's task runner; the shard task needs them all, since dedup is
global and first-occurrence-wins in source order. A finished stage short-circuits inside the tasks (manifest hit).
"""

from __future__ import annotations

from prefect import flow

from eagle3.config import PipelineConfig
from flows.discover import discover_flow
from tasks.data import build_prompt_shards_task, normalize_source_task, prompts_plan_task


@flow(name="normalize", log_prints=False)
def normalize_flow(config: PipelineConfig, catalog_dir: str) -> str:
    """Returns the prompts stage directory."""
    plan = prompts_plan_task(config, catalog_dir)
    planned = {line["source"]: line["planned"] for line in plan["plan"]}
    futures = [
        normalize_source_task.submit(config, name, catalog_dir, plan["prompts_dir"], planned[name])
        for name in plan["sources"]
    ]
    spills = [future.result() for future in futures]
    return build_prompt_shards_task(config, spills, plan["prompts_dir"])


@flow(name="prompts", log_prints=False)
def prompts_flow(config: PipelineConfig) -> str:
    """discover then normalize (``eagle3 normalize``); returns the prompts stage directory."""
    return normalize_flow(config, discover_flow(config))
