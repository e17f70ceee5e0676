"""The features stage's manifest: what ``finalize_features`` writes (last) over every finished
feature shard of a directory and their quarantine files, and ``feature_shards``, what readers take
from it."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from eagle3.capture.schema import CAPTURE_QUARANTINE_SCHEMA, FEATURE_SCHEMA, LAYER_CONVENTION
from eagle3.capture.shard import output_paths, shard_footer, shard_index_of
from eagle3.config.pipeline import PipelineConfig
from eagle3.data.parquet import open_shard
from eagle3.rundir.layout import SHARD_GLOB, hashes_file_name, shard_index
from eagle3.rundir.runroot import FileEntry, Manifest

logger = logging.getLogger(__name__)


def finalize_features(config: PipelineConfig, out_dir: Path, shard_ids: Sequence[int]) -> Path:
    """Write the stage manifest (last) over every finished shard in ``out_dir`` and its quarantine
    file.

    ``shard_ids`` are this run's shards (each must be finished); shards finished by earlier runs
    into the same directory (earlier nights) are listed too, so the manifest always describes
    everything captured so far. Nothing is read back to be hashed that need not be (a night of
    Kimi-K2.5 features is ~3 TB, ~40 min of sha256 on one core at 1.2 GB/s, and the directory grows
    every night): a file its writer's ``hashes-NNNNN.json`` lists at its size takes the sha256 and
    footer sha256 computed as it was written, by whichever run or process wrote it (a run killed
    before this stage finished, a re-trigger's earlier night); a file only the previous manifest
    lists at its size keeps that entry. Either way a shard damaged since it was written is not
    blessed with its damaged bytes' sha256. Only the rest (a kill between a shard and its hashes, a
    directory from before them) is hashed here, without a footer hash, so the loader checks all of
    it first (``eagle3.rundir.integrity``)."""
    out_dir = Path(out_dir)
    indices = set(shard_ids)
    indices |= {shard_index_of(p) for p in out_dir.glob(SHARD_GLOB)}
    known = _known(out_dir, indices)
    files, rows, quarantined, tokens = [], 0, 0, 0
    for index in sorted(indices):
        shard, quarantine, parts = output_paths(out_dir, index)
        if parts.exists() or not shard.exists():
            raise RuntimeError(
                f"feature shard {index} is not finished; re-run `eagle3 capture --shard {index}`"
            )
        n = open_shard(shard, schema=FEATURE_SCHEMA).metadata.num_rows
        q = open_shard(quarantine, schema=CAPTURE_QUARANTINE_SCHEMA).metadata.num_rows
        files += [_entry(shard, n, out_dir, known), _entry(quarantine, q, out_dir, known)]
        rows, quarantined, tokens = rows + n, quarantined + q, tokens + _tokens(shard)
    shard_bytes = sum(f.bytes for f in files if f.path.startswith("shard-"))
    per_token = shard_bytes / tokens if tokens else None
    stats = {
        "shards": len(indices),
        "rows": rows,
        "quarantined": quarantined,
        "tokens": tokens,
        "bytes_per_token": round(per_token, 2) if per_token else None,
        "bytes_per_token_over_8h": round(per_token / (8 * config.target.hidden_size), 4)
        if per_token
        else None,
        "footer": shard_footer(config, out_dir.name),
    }
    manifest = Manifest(
        stage="features",
        fingerprint=out_dir.name,
        files=files,
        config={
            "capture": config.capture.model_dump(mode="json"),
            "target": config.target.model_dump(mode="json"),
            "layer_ids": config.sglang_layer_ids,
            "layer_convention": LAYER_CONVENTION,
        },
        stats=stats,
    )
    return manifest.write(out_dir)


# file name -> (the size it must have, sha256, footer's sha256)
Known = dict[str, tuple[int, str, str | None]]


def _known(out_dir: Path, indices: set[int]) -> Known:
    """The hashes known without reading. A shard's ``hashes-NNNNN.json`` is what its last build
    recorded (``{}`` while it builds) and replaces the previous manifest's entries of its files,
    which may describe an earlier build; one that does not parse replaces them with nothing (its
    files are hashed). A shard without one (from before writers recorded them) keeps the previous
    manifest's entries."""
    previous = Manifest.read(out_dir)
    known: Known = (
        {e.path: (e.bytes, e.sha256, e.footer_sha256) for e in previous.files} if previous else {}
    )
    for index in sorted(indices):
        path = out_dir / hashes_file_name(index)
        if not path.exists():
            continue
        for file in output_paths(out_dir, index)[:2]:
            known.pop(file.name, None)
        try:
            known |= {
                name: (w["bytes"], w["sha256"], w["footer_sha256"])
                for name, w in json.loads(path.read_text()).items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning(
                "%s does not parse (%s); hashing shard %d's files instead", path, exc, index
            )
    return known


def _entry(path: Path, rows: int, out_dir: Path, known: Known) -> FileEntry:
    """``path``'s manifest entry, hashed only when ``known`` has no hashes for it at its size."""
    size, sha, footer = known.get(path.name, (None, None, None))
    if size != path.stat().st_size:
        sha, footer = None, None
    return FileEntry.of(path, rows=rows, base=out_dir, sha256=sha, footer_sha256=footer)


def _tokens(path: Path) -> int:
    seq = pq.read_table(path, columns=["seq_len"]).column(0)
    return int(pc.sum(seq).as_py() or 0)


def feature_shards(features_dir: Path) -> list[Path]:
    """The feature shards of a finished features stage, from its manifest (raises if the stage is
    not done)."""
    manifest = Manifest.read(Path(features_dir))
    if manifest is None:
        raise FileNotFoundError(f"{features_dir}: no manifest.json; run `eagle3 capture` first")
    return [Path(features_dir) / f.path for f in manifest.files if shard_index(f.path) is not None]
