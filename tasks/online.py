"""The ``train.features`` decision as a task: the night's flow branches on it, its reason is in the run's logs."""

from __future__ import annotations

from prefect import get_run_logger, task

from eagle3.config.pipeline import PipelineConfig
from eagle3.online.costs import choose_features


@task(name="features-mode")
def features_mode_task(config: PipelineConfig) -> str:
    """``stored`` or ``online`` (``auto`` decided by the disk budget); logs why in one line."""
    mode, why = choose_features(config)
    get_run_logger().info("%s", why)
    return mode
