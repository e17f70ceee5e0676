"""The features manifest of a night that a later process finalizes (a killed capture resumed, a
failed shard re-triggered): with each writer's ``hashes-NNNNN.json`` against without them (a
directory nothing recorded), side by side in one run, and the loader's build after each.

    PYTHONPATH=.:benchmarks python benchmarks/finalize.py [--hidden 1024] [--shards 3] [--batches 8]
    [--dir DIR]

The shards are written through ``PartWriter`` as a capture writes them (raw bf16, uncompressed:
65,536 tokens a shard at the defaults, ~540 MB each at H 1,024). Without the writers' hashes
finalize hashes every file whole and lists it without a footer hash, so the loader's build then
hashes every shard whole too (``eagle3.rundir.integrity``); with them neither reads a shard. Both
arms run on a warm page cache; a night of Kimi-K2.5 features (~3 TB) does not fit one, so its cost
there is the bytes hashed at the disk's rate.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from capture_writer import make_batches, writer_config

from eagle3.capture.manifest import finalize_features
from eagle3.capture.shard import shard_footer
from eagle3.capture.writer import PartWriter
from eagle3.config.pipeline import PipelineConfig
from eagle3.recipes import world_cache
from eagle3.rundir.layout import SHARD_GLOB, hashes_file_name, parts_dir_name
from eagle3.rundir.runroot import MANIFEST, Manifest, wait_removals
from eagle3.train.data import FeatureDataset
from eagle3.worlds.world import TinyWorldSpec, build_tiny_world


def write_night(config: PipelineConfig, out: Path, shards: int, batches: int) -> int:
    """``shards`` finished feature shards in ``out``, as a run killed before its stage finished
    leaves them; their bytes."""
    parts = make_batches(config.target.hidden_size, "raw", batches)
    for index in range(shards):
        (out / parts_dir_name(index)).mkdir(parents=True)
        writer = PartWriter(config, index, out, shard_footer(config, out.name), [], None)
        for batch in parts:
            writer.submit(batch)
        writer.finish([])
    wait_removals()
    return sum(p.stat().st_size for p in out.glob(SHARD_GLOB))


def finalize_and_build(config: PipelineConfig, out: Path, shards: int) -> dict[str, float | int]:
    """Finalize with no manifest (the night wrote none) as the re-trigger of the last shard, then
    build the loader."""
    (out / MANIFEST).unlink(missing_ok=True)
    start = time.perf_counter()
    finalize_features(config, out, [shards - 1])
    finalized = time.perf_counter()
    FeatureDataset(out, batch_size=2, shuffle=False)
    built = time.perf_counter()
    footers = sum(e.footer_sha256 is not None for e in Manifest.read(out).files)
    return {
        "finalize_s": round(finalized - start, 3),
        "loader_build_s": round(built - finalized, 3),
        "entries_with_footer_hash": footers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument(
        "--batches", type=int, default=8, help="batches of 8 x 1,024 tokens per shard"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the shards go (default: a temp dir)"
    )
    args = parser.parse_args()
    # its tokenizer: the footer's template hash
    world, _ = build_tiny_world(world_cache(), TinyWorldSpec())
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        config = writer_config(
            tmp, args.hidden, encoding="raw", compression="none", model_path=str(world.model_dir)
        )
        out = Path(tmp) / "features" / "fp"
        size = write_night(config, out, args.shards, args.batches)
        recorded = finalize_and_build(config, out, args.shards)
        for index in range(args.shards):
            (out / hashes_file_name(index)).unlink()
        unrecorded = finalize_and_build(config, out, args.shards)
        shutil.rmtree(out)
    print(
        json.dumps(
            {
                "hidden": args.hidden,
                "shards": args.shards,
                "shards_mb": round(size / 1e6),
                "with_writers_hashes": recorded,
                "without": unrecorded,
                "finalize_ratio_without_over_with": round(
                    unrecorded["finalize_s"] / max(recorded["finalize_s"], 1e-3), 1
                ),
                "without_hashed_mb_per_s": round(size / 1e6 / max(unrecorded["finalize_s"], 1e-3)),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
