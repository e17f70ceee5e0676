"""Capture throughput and agreement by backend: rows/s of ``capture_shard`` with
``capture.backend=sglang`` (SGLang's model runner in worker processes, states over shared memory) vs
``capture.backend=hf`` (transformers in this process), on the same rows, the same target and the
same machine, side by side in one run: ``--rounds`` rounds alternate the arms' order, the median and
range of the per-round ratios (sglang / hf) are printed, and so is the largest difference between
the two arms' stored features (states, or top-k ids and probabilities).

    python benchmarks/capture_backends.py [--quick] [--hidden 256] [--layers 8] [--samples 64]
    [--rounds 3]
                                          [--threads N] [--device cpu|cuda] [--tp 1] [--dtype
                                          float32] [--encoding raw|fp8_topk] [--topk 16]
    python benchmarks/capture_backends.py --recipe kimi_k2_5 --model-path DIR [--samples 32]   # sglang arm only

The target is a randomly initialised Llama of the given size with the tiny tokenizer
(``capture_overhead.py``'s: ``hidden // 64`` heads, ``hidden // 128`` KV heads, so ``--tp`` must
divide both), the rows random token sequences of 64-1024 tokens. Each arm runs the whole shard:
read, plan, forward, quarantine checks, part files, the merged shard. Both backends are loaded
before the first round (not timed; their load times are printed). ``--threads`` sets this process's
torch threads; on a CPU the SGLang workers get the same number split over ``--tp`` ranks, so both
arms compute on the same cores. On this CPU SGLang runs through the project's runtime
(``infra/dev.sh sglang``); on a GPU node through the ``sglang`` extra or ``EAGLE3_SGLANG_PYTHON``.
``--recipe`` captures random rows of the recipe's own target (``--model-path``: its checkpoint) with
its SGLang settings (tp 8 for the large ones), the ``sglang`` arm alone: no transformers process can
hold those targets.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
from capture_overhead import build_target, make_config, make_regen_shard, spread
from common import add_target_options, benchmark_parser, start_torch

from eagle3.capture.encoding import dequantize
from eagle3.capture.footprint import served_plan
from eagle3.capture.hf import load_hf_backend
from eagle3.capture.schema import footer_codecs
from eagle3.capture.sglang.backend import SGLangBackend
from eagle3.capture.shard import capture_shard
from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.data.parquet import shard_metadata
from eagle3.recipes import load_recipe
from eagle3.rundir.runroot import wait_removals


def timed(config: PipelineConfig, regen: Path, out_dir: Path, backend) -> tuple[float, Path]:
    start = time.perf_counter()
    path = Path(capture_shard(config, regen, out_dir, backend=backend)["path"])
    seconds = time.perf_counter() - start
    wait_removals()
    return seconds, path


def largest_differences(a: Path, b: Path) -> dict[str, float]:
    """Max |a - b| over every stored value of two feature shards of the same rows (top-k: also the
    share of ids that differ, from near-ties)."""
    out: dict[str, float] = {}
    tables = [pq.read_table(p) for p in (a, b)]
    codecs = [footer_codecs(shard_metadata(p)) for p in (a, b)]
    for column, index in (("aux_hidden", 0), ("last_hidden", 1)):
        left, right = (
            c[index].views(t.column(column)) for c, t in zip(codecs, tables, strict=True)
        )
        for (x, xs), (y, ys) in zip(left, right, strict=True):
            if column == "last_hidden" and x.dtype == torch.int32:  # top-k: (ids, probs)
                out["topk_ids_differing"] = max(
                    out.get("topk_ids_differing", 0.0), (x != y).float().mean().item()
                )
                out["topk_probs"] = max(
                    out.get("topk_probs", 0.0), (xs.float() - ys.float()).abs().max().item()
                )
            else:  # a state: as stored, or fp8 values with their scales
                x, y = (
                    v.float() if s is None else dequantize(v, s, torch.float32)
                    for v, s in ((x, xs), (y, ys))
                )
                out[column] = max(out.get(column, 0.0), (x - y).abs().max().item())
    return {k: float(f"{v:.3g}") for k, v in out.items()}


def run_rounds(
    n: int, configs: dict, backends: dict, regen: Path, tmp_path: Path
) -> tuple[list[dict], dict]:
    rows = pq.read_metadata(regen).num_rows
    for arm in backends:  # warm-up: first-call costs
        timed(configs[arm], regen, tmp_path / f"warm-{arm}" / "fp", backends[arm])
    out, shards = [], {}
    for r in range(n):
        order = list(backends) if r % 2 == 0 else list(reversed(backends))
        seconds = {}
        for arm in order:
            seconds[arm], shards[arm] = timed(
                configs[arm], regen, tmp_path / f"{arm}-{r}" / "fp", backends[arm]
            )
        out.append(
            {
                "order": order,
                **{f"{arm}_rows_per_s": round(rows / s, 2) for arm, s in seconds.items()},
            }
        )
        if len(seconds) == 2:
            out[-1]["ratio"] = round(seconds["hf"] / seconds["sglang"], 3)
        print(json.dumps({"round": r, **out[-1]}), flush=True)
    return out, (largest_differences(shards["sglang"], shards["hf"]) if len(shards) == 2 else {})


def gpu_used() -> list[str]:
    """Memory in use on each visible GPU, by every process (the SGLang workers included)."""
    if not torch.cuda.is_available():
        return []
    return [
        f"{(total - free) / 1e9:.1f} GB"
        for free, total in map(torch.cuda.mem_get_info, range(torch.cuda.device_count()))
    ]


def configs_for(args: argparse.Namespace, tmp_path: Path) -> tuple[dict[str, PipelineConfig], int]:
    """The arms' configs and the target's vocabulary size."""
    sglang = [
        "capture.backend=sglang",
        f"capture.device={args.device}",
        f"capture.encoding={args.encoding}",
        f"capture.topk={args.topk}",
    ]
    if args.recipe:
        config = load_recipe(
            args.recipe,
            [
                f"root={tmp_path / 'root'}",
                f"target.model_path={args.model_path}",
                f"capture.device={args.device}",
            ],
        )
        return {"sglang": config}, config.target.vocab_size
    model_dir = build_target(tmp_path / "model", hidden=args.hidden, layers=args.layers)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    base = make_config(
        model_dir,
        tmp_path / "root",
        hidden=args.hidden,
        layers=args.layers,
        dtype=args.dtype,
        vocab=vocab,
    )
    return {
        "hf": with_overrides(
            base,
            [
                f"capture.device={args.device}",
                f"capture.encoding={args.encoding}",
                f"capture.topk={args.topk}",
            ],
        ),
        "sglang": with_overrides(
            base, [*sglang, f"capture.sglang.tp={args.tp}", f"capture.gpus={args.tp}"]
        ),
    }, vocab


def main() -> None:
    parser = benchmark_parser(__doc__, quick="a tiny target and 12 rows")
    add_target_options(parser, hidden=256, layers=8, samples=64, devices=["cpu", "cuda"])
    parser.add_argument("--tp", type=int, default=1, help="SGLang tensor-parallel ranks")
    parser.add_argument("--encoding", default="raw", choices=["raw", "fp8_topk"])
    parser.add_argument("--topk", type=int, default=16, help="k of fp8_topk")
    parser.add_argument(
        "--recipe", default=None, help="capture the recipe's own target (sglang arm only)"
    )
    parser.add_argument(
        "--model-path", default=None, help="with --recipe: the target checkpoint's directory"
    )
    args = parser.parse_args()
    start_torch(args, quick=(128, 4, 12))
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        configs, vocab = configs_for(args, tmp_path)
        loads, backends = {}, {}
        for arm, config in configs.items():
            started = time.perf_counter()
            backends[arm] = load_hf_backend(config) if arm == "hf" else SGLangBackend(config)
            loads[arm] = round(time.perf_counter() - started, 1)
        regen, seqs = make_regen_shard(tmp_path / "regen" / "fp", args.samples, vocab)
        try:
            rounds, differences = run_rounds(args.rounds, configs, backends, regen, tmp_path)
            used = gpu_used()  # the workers still hold the target and their pools
        finally:
            backends["sglang"].close()
        plan = served_plan(configs["sglang"]).describe()  # while the checkpoint is still there
    summary = {
        "device": args.device,
        "dtype": configs["sglang"].capture.dtype,
        "tp": backends["sglang"].ranks,
        "encoding": args.encoding,
        "rows": args.samples,
        "tokens": sum(len(s) for s in seqs),
        "torch_threads": torch.get_num_threads(),
        "load_s": loads,
        "rounds": len(rounds),
        "memory_plan_per_gpu": plan,
        "gpu_used_after_rounds": used,
        **{
            f"{arm}_rows_per_s": spread([r[f"{arm}_rows_per_s"] for r in rounds])
            for arm in backends
        },
    }
    if "hf" in backends:
        summary |= {
            "ratio_sglang_over_hf": spread([r["ratio"] for r in rounds]),
            "max_abs_difference": differences,
        }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
