"""``discover``: resolve the configured sources into the catalog stage (one task; a manifest hit when unchanged)."""

from __future__ import annotations

from prefect import flow

from eagle3.config import PipelineConfig
from tasks.data import discover_task


@flow(name="discover", log_prints=False)
def discover_flow(config: PipelineConfig) -> str:
    """Returns the catalog stage directory."""
    return discover_task(config)
