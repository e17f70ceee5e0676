"""Dataset catalog, discovery, normalization, dedup/decontamination and the shared Parquet shard writer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eagle3.config import PipelineConfig


def run_normalize(config: PipelineConfig) -> Path:
    """The prompts stage in one call (see ``eagle3.data.pipeline``); imported lazily to keep ``eagle3.data`` light."""
    from eagle3.data.pipeline import run_normalize as run

    return run(config)
