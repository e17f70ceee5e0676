"""The ``orchestration`` and ``monitor`` sections of the pipeline config: runners and reporting."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eagle3.config.base import StrictModel


class OrchestrationConfig(StrictModel):
    task_runner: Literal["thread", "ray"] = "thread"
    max_workers: int = Field(default=4, gt=0)
    ray_address: str | None = None
    progress_every_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between refreshes of a running stage's "
        "Prefect boards (progress, live unit table, run status); a failed unit and the "
        "end refresh at once. Per period, not per unit: each refresh is several API "
        "writes and a read of every unit's files.",
    )


class MonitorConfig(StrictModel):
    """How a running stage reports itself to a person watching (Prefect artifacts, logs, the CLI
    bar)."""

    log_every_s: float = Field(
        default=300.0, gt=0, description="Seconds between the stage status log lines."
    )
    rate_window_s: float = Field(
        default=300.0, gt=0, description="Seconds the throughput and ETA average over."
    )
