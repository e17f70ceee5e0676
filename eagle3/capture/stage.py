"""The capture stage's plan: which regen stage feeds it, which of its shards are ready, where features go.

The regen stage is found the way regen itself names it (prompts fingerprint + regen config), or given explicitly.
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
from eagle3.runroot import Manifest

logger = logging.getLogger(__name__)


class CaptureInputError(ValueError):
    """The regen stage is missing; the message says which command produces it."""


def find_regen_dir(config: PipelineConfig) -> Path:
    """The regen stage of this config (from the finished prompts stage), or the most recent one under the root."""
    from eagle3.regen.plan import RegenInputError, find_prompts_dir, regen_fingerprint

    try:
        prompts = Manifest.read(find_prompts_dir(config))
    except RegenInputError:
        prompts = None
    if prompts is not None:
        path = stage_dir(config.root_path, "regen", regen_fingerprint(prompts.fingerprint, config))
        if path.exists():
            return path
    base = config.root_path / "regen"
    candidates = sorted(base.glob("*/shard-*.parquet"), key=lambda p: p.stat().st_mtime) if base.exists() else []
    if not candidates:
        raise CaptureInputError(f"no regen shards under {base}: run `eagle3 regen` first, or pass --regen-dir")
    return candidates[-1].parent


def plan_capture(
    config: PipelineConfig, *, regen_dir: Path | None = None, shard_ids: list[int] | None = None
) -> dict[str, Any]:
    """A plain-dict plan: ``regen_dir, fingerprint, features_dir, shards {index: regen shard path}, missing``."""
    regen = Path(regen_dir) if regen_dir is not None else find_regen_dir(config)
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


def find_features_dir(config: PipelineConfig) -> Path:
    """The finished features stage of this config's regen stage, else the most recent finished one."""
    try:
        path = Path(plan_capture(config)["features_dir"])
        if Manifest.read(path) is not None:
            return path
    except CaptureInputError:
        pass
    base = config.root_path / "features"
    done = sorted(base.glob("*/manifest.json"), key=lambda p: p.stat().st_mtime) if base.exists() else []
    if not done:
        raise CaptureInputError(f"no finished features stage under {base}: run `eagle3 capture` first")
    return done[-1].parent


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
