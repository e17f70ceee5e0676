"""The gate flow: one task that benchmarks drafts against the baseline (and champion) and publishes the report."""

from __future__ import annotations

from typing import Any

from prefect import flow

from eagle3.config import PipelineConfig
from eagle3.recipes import ConfigRef
from tasks.common import resolve_config_task
from tasks.gate import gate_task


@flow(name="gate", log_prints=False)
def gate_flow(
    config: PipelineConfig | ConfigRef,
    drafts: list[str],
    baseline_url: str | None = None,
    spec_url: str | None = None,
    champion_url: str | None = None,
    flavour: str = "reference",
    features_dir: str | None = None,
    promote: bool = True,
    force: bool = False,
) -> dict[str, Any]:
    """Run the benchmark gate; the Markdown report is a Prefect artifact (key ``gate-report``). ``config`` is a
    resolved config, or a ``ConfigRef`` (a deployment's) resolved on the worker."""
    return gate_task(
        resolve_config_task(config),
        drafts,
        baseline_url=baseline_url,
        spec_url=spec_url,
        champion_url=champion_url,
        flavour=flavour,
        features_dir=features_dir,
        promote=promote,
        force=force,
    )
