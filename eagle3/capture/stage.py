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
    fp = features_fingerprint(config, regen.name)
    return {
        "regen_dir": str(regen),
        "fingerprint": fp,
        "features_dir": str(stage_dir(config.root_path, "capture", fp)),
        "shards": ready,
        "missing": missing,
    }


def capture_progress(plan: dict[str, Any]) -> tuple[int, int]:
    """(samples done, samples total) of a plan, read from files on disk (safe to call from another process).

    A finished shard counts all its regen rows; a running one the rows of its finished part files."""
    from eagle3.capture.run import output_paths
    from eagle3.data.parquet import ShardError, open_shard

    out_dir, done, total = Path(plan["features_dir"]), 0, 0
    for index, regen_shard in plan["shards"].items():
        rows = open_shard(Path(regen_shard)).metadata.num_rows
        total += rows
        shard, _, parts = output_paths(out_dir, int(index))
        if shard.exists():
            done += rows
            continue
        for part in parts.glob("*.part-*.parquet") if parts.exists() else []:
            try:
                done += open_shard(part).metadata.num_rows
            except (ShardError, FileNotFoundError):
                continue  # removed by the merge between listing and opening
    return done, total
