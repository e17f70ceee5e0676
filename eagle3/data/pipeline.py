"""The prompts stage in one call (CLI-less tests, notebooks): discover, normalize each source, dedup + shard.

The Prefect flow (``flows/normalize.py``) runs the same three library calls as separate tasks.
"""

from __future__ import annotations

import logging
from pathlib import Path

from eagle3.config import PipelineConfig
from eagle3.data.discover import discover
from eagle3.data.mix import MixLine
from eagle3.data.normalize import normalize_source, prompts_fingerprint
from eagle3.data.shard import build_prompt_shards
from eagle3.data.stage import load_catalog, mix_lines, read_stage_stats
from eagle3.layout import stage_dir

logger = logging.getLogger(__name__)


def prompts_dir(config: PipelineConfig, catalog_dir: Path) -> Path:
    """``<root>/prompts/<fp>`` for a finished catalog stage."""
    return stage_dir(config.root_path, "normalize", prompts_fingerprint(config, Path(catalog_dir).name))


def mix_plan(config: PipelineConfig, catalog_dir: Path) -> list[MixLine]:
    return mix_lines(config, load_catalog(catalog_dir))


def run_normalize(config: PipelineConfig) -> Path:
    """Discover, normalize and shard; a second call with the same config is a no-op (manifest hit)."""
    catalog_dir = discover(config)
    out = prompts_dir(config, catalog_dir)
    if read_stage_stats(out) is not None:
        logger.info("prompts %s are up to date (manifest hit): nothing to do", out)
        return out
    spills = [normalize_source(config, source, catalog_dir, out) for source in config.sources]
    return build_prompt_shards(config, spills, out)
