"""The capture stage's plan: which regen stage feeds it, which of its shards are ready, where features go.

The caller names the regen stage (``eagle3.lineage`` finds the one the config names).
A regen shard is ready when its final ``shard-NNNNN.parquet`` validates; shards not ready (still running, or failed
and listed for re-trigger) are reported as ``missing`` and skipped, so a night's capture takes what regen finished.
The features directory is ``<root>/features/<features_fingerprint(config, regen_fp)>``: one per regen stage, so a
nightly run over a grown prompt set adds shards to it instead of recapturing old ones.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from eagle3.capture.run import REGEN_INPUT_SCHEMA, features_fingerprint, shard_index_of
from eagle3.config import PipelineConfig
from eagle3.data.parquet import shard_is_valid
from eagle3.layout import SHARD_GLOB, stage_dir

logger = logging.getLogger(__name__)


def plan_capture(config: PipelineConfig, *, regen_dir: Path, shard_ids: list[int] | None = None) -> dict[str, Any]:
    """A plain-dict plan: ``regen_dir, fingerprint, features_dir, shards {index: regen shard path}, missing``."""
    regen = Path(regen_dir)
    present = {shard_index_of(p): p for p in sorted(regen.glob(SHARD_GLOB))}
    wanted = sorted(set(shard_ids)) if shard_ids is not None else sorted(present)
    ready = {i: str(present[i]) for i in wanted if i in present and shard_is_valid(present[i],
                                                                                  schema=REGEN_INPUT_SCHEMA)}
    missing = [i for i in wanted if i not in ready]
    if missing:
        logger.warning("regen shards %s are not finished in %s; capturing the %d that are", missing, regen, len(ready))
    features_dir = features_dir_for(config, regen)
    return {
        "regen_dir": str(regen),
        "fingerprint": features_dir.name,
        "features_dir": str(features_dir),
        "shards": ready,
        "missing": missing,
    }


def features_dir_for(config: PipelineConfig, regen_dir: Path) -> Path:
    """``<root>/features/<fp>``: the features stage of this config over a regen stage (one per regen stage)."""
    return stage_dir(config.root_path, "capture", features_fingerprint(config, Path(regen_dir).name))


def capture_progress(regen_dir: Path, features_dir: Path, *, shard_ids: list[int] | None = None) -> tuple[int, int]:
    """(samples done, samples total) over the finished regen shards (or only ``shard_ids``), read from files on disk
    (safe to call from another process while the flow runs, and without its plan).

    A finished feature shard counts all its regen rows; a running one the rows of its finished part files. A regen
    shard that does not open yet is not counted: the flow's plan skips it as not ready too."""
    from eagle3.capture.run import output_paths
    from eagle3.data.parquet import ShardError, open_shard

    wanted = None if shard_ids is None else set(shard_ids)
    done, total = 0, 0
    for regen_shard in sorted(Path(regen_dir).glob(SHARD_GLOB)):
        index = shard_index_of(regen_shard)
        if wanted is not None and index not in wanted:
            continue
        try:
            rows = open_shard(regen_shard).metadata.num_rows
        except (ShardError, FileNotFoundError):
            continue
        total += rows
        shard, _, parts = output_paths(Path(features_dir), index)
        if shard.exists():
            done += rows
            continue
        for part in parts.glob("*.part-*.parquet") if parts.exists() else []:
            try:
                done += open_shard(part).metadata.num_rows
            except (ShardError, FileNotFoundError):
                continue  # removed by the merge between listing and opening
    return done, total
