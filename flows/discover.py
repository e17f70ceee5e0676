"""``discover``: resolve the configured sources into the catalog stage (one unit; a manifest hit
when unchanged).

The one stage wiring (``flows.stage.run_stage``) over ``eagle3.data.stage.DiscoverStage``; its table
artifact lists the resolved datasets.
"""

from __future__ import annotations

from prefect import flow

from eagle3.config.pipeline import PipelineConfig
from eagle3.data.stage import DiscoverStage
from flows.stage import run_stage


@flow(name="discover", log_prints=False)
def discover_flow(config: PipelineConfig) -> str:
    """Returns the catalog stage directory."""
    return str(run_stage(DiscoverStage(), config).out_dir)
