"""``normalize``: one unit per source (its normalized spill), then dedup + shard in finalize
(docs/DESIGN.md, "Prompts" and "Prefect usage").

The one stage wiring (``flows.stage.run_stage``) over ``eagle3.data.stage.NormalizeStage``: the
per-source units run concurrently on the flow's task runner; finalize needs them all, since dedup is
global and first-occurrence-wins in source order. A finished stage is a manifest hit (every source
unit is skipped, finalize writes nothing).
"""

from __future__ import annotations

from prefect import flow

from eagle3.config.pipeline import PipelineConfig
from eagle3.data.stage import NormalizeStage
from flows.discover import discover_flow
from flows.stage import run_stage


@flow(name="normalize", log_prints=False)
def normalize_flow(config: PipelineConfig, catalog_dir: str | None = None) -> str:
    """Normalize the sources of ``catalog_dir`` (default: the finished catalog this config names);
    returns the prompts stage directory."""
    return str(run_stage(NormalizeStage(), config, catalog_dir=catalog_dir).out_dir)


@flow(name="prompts", log_prints=False)
def prompts_flow(config: PipelineConfig) -> str:
    """discover then normalize (``eagle3 normalize``); returns the prompts stage directory."""
    return normalize_flow(config, discover_flow(config))
