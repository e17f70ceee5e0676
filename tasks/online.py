"""The ``train.features`` decision as a task: the night's flow branches on it, its reason is in the run's logs and
the night's summary."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from eagle3.config.pipeline import PipelineConfig
from eagle3.capture.costs import FeaturesChoice, choose_features


@task(name="features-mode")
def features_mode_task(config: PipelineConfig, regen_dir: str | None = None) -> FeaturesChoice:
    """``stored`` or ``online`` and why (``auto``: the disk budget against the tokens counted in ``regen_dir``'s
    shards, or the estimate before regen has run); logs why in one line."""
    choice = choose_features(config, regen_dir=Path(regen_dir) if regen_dir else None)
    get_run_logger().info("%s", choice.why)
    return choice
