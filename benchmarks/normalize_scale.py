"""Prompts-stage memory and throughput at two sizes, side by side (ratios, as in docs/DESIGN.md,
"What the benchmarks measure").

For each size a synthetic JSONL source (distinct random-word prompts, ShareGPT layout) is normalized
in a fresh
subprocess, twice:

* ``normalize``: discovery + the normalize stage's one source unit (read, convert, validate,
  token-length, decontaminate, spill). This part streams, so its peak RSS should not grow with the
  input (goal: RSS ratio large/small <= 1.2).
* ``full``: discover + the whole normalize stage (the above + global exact/near dedup + shards).
  Dedup keeps a digest and a MinHash signature per kept row by design, so its RSS grows with rows;
  the bytes per row are reported.

Usage: ``python benchmarks/normalize_scale.py [--quick]`` (quick: 20K and 200K rows; default 100K
and 1M).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = [
    f"{a}{b}{c}"
    for a in ("ka", "lo", "mi", "nu", "pe", "ro", "sa", "ti")
    for b in "aeiou"
    for c in "bdgkmt"
]


def write_source(path: Path, rows: int, seed: int = 0) -> None:
    """Distinct prompts of 12-40 random words plus a short answer; streamed to disk."""
    rng = random.Random(seed)
    with open(path, "w") as fh:
        for i in range(rows):
            prompt = f"{i} " + " ".join(rng.choices(WORDS, k=rng.randint(12, 40))) + "?"
            answer = " ".join(rng.choices(WORDS, k=20))
            row = {
                "id": i,
                "conversations": [
                    {"from": "human", "value": prompt},
                    {"from": "gpt", "value": answer},
                ],
            }
            fh.write(json.dumps(row) + "\n")


def build_tokenizer(out: Path) -> None:
    from eagle3.worlds.tiny_target import build_tokenizer as build

    rng = random.Random(1)
    build(
        (" ".join(rng.choices(WORDS, k=30)) for _ in range(2000)), vocab_size=1024
    ).save_pretrained(out)


def warm_up(config: object, work: Path) -> None:
    """Run the whole stage once on a small file first: imports and tokenizer loading are not
    throughput."""
    warm = config.model_copy(deep=True)
    warm.root = str(work / "run-warm")
    warm.sources[0].path = str(work / "rows-warm.jsonl")
    normalize_stage(warm)


def normalize_stage(config: object) -> object:
    """Discover, then the whole normalize stage in this process (``eagle3.stage.run_stage``);
    returns its result."""
    from eagle3.data.stage import DiscoverStage, NormalizeStage
    from eagle3.stage import run_stage

    return run_stage(
        NormalizeStage(), config, catalog_dir=run_stage(DiscoverStage(), config).out_dir
    )


def child(mode: str, work: Path, rows: int) -> None:
    """Runs in a subprocess: normalize one size and print a JSON line with rows/s and peak RSS."""
    from eagle3.config.data import SourceConfig
    from eagle3.config.pipeline import PipelineConfig, with_overrides
    from eagle3.config.target import TargetConfig
    from eagle3.data.stage import DiscoverStage, NormalizeStage
    from eagle3.stage import run_stage

    bench = work / "bench.jsonl"
    config = PipelineConfig(
        name="bench",
        root=str(work / f"run-{mode}-{rows}"),
        target=TargetConfig(
            model_path=str(work / "model"), num_layers=8, hidden_size=64, vocab_size=1024
        ),
        sources=[
            SourceConfig(adapter="jsonl", name="synthetic", path=str(work / f"rows-{rows}.jsonl"))
        ],
    )
    config = with_overrides(
        config, [f"gate.prompt_sets={{bench: '{bench}'}}", "normalize.shard_size=2000"]
    )
    warm_up(config, work)
    start = time.perf_counter()
    if mode == "normalize":
        stage = NormalizeStage()
        plan = stage.plan(config, catalog_dir=run_stage(DiscoverStage(), config).out_dir)
        kept = stage.run_unit(config, plan, plan.units[0]).rows
    else:
        kept = normalize_stage(config).summary["kept"]
    seconds = time.perf_counter() - start
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps({"mode": mode, "rows": rows, "kept": kept, "seconds": seconds, "rss_mb": rss_mb})
    )


def run(sizes: list[int], modes: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="normalize-bench-") as tmp:
        work = Path(tmp)
        build_tokenizer(work / "model")
        rng = random.Random(7)
        with open(work / "bench.jsonl", "w") as fh:
            for i in range(16):
                fh.write(
                    json.dumps({"id": str(i), "prompt": " ".join(rng.choices(WORDS, k=20))}) + "\n"
                )
        write_source(work / "rows-warm.jsonl", 500, seed=1)
        for n in sizes:
            write_source(work / f"rows-{n}.jsonl", n)
        results = {}
        for mode in modes:
            for n in sizes:
                cmd = [sys.executable, __file__, "--child", mode, str(work), str(n)]
                line = subprocess.run(
                    cmd, check=True, capture_output=True, text=True, cwd=REPO
                ).stdout.strip()
                r = json.loads(line.splitlines()[-1])
                results[(mode, n)] = r
                print(
                    f"{mode:9s} {n:>9,} rows: {n / r['seconds']:>9,.0f} rows/s, peak RSS {r['rss_mb']:7.1f} MB "
                    f"(kept {r['kept']:,})"
                )
        small, large = sizes
        for mode in modes:
            a, b = results[(mode, small)], results[(mode, large)]
            extra = (b["rss_mb"] - a["rss_mb"]) * 2**20 / max(b["kept"] - a["kept"], 1)
            print(
                f"{mode:9s} RSS ratio {large:,}/{small:,} rows = {b['rss_mb'] / a['rss_mb']:.2f} "
                f"(goal <= 1.2 for normalize); marginal {extra:,.0f} bytes/row"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="20K and 200K rows instead of 100K and 1M"
    )
    parser.add_argument("--modes", default="normalize,full", help="comma list of: normalize, full")
    parser.add_argument(
        "--child", nargs=3, metavar=("MODE", "WORK", "ROWS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        mode, work, rows = args.child
        child(mode, Path(work), int(rows))
        return
    run([20_000, 200_000] if args.quick else [100_000, 1_000_000], args.modes.split(","))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
