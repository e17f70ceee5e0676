"""Capture overhead: capture+write tok/s / bare forward tok/s on the same model and batches
(goal >= 0.90; docs/DESIGN.md, "What the benchmarks measure"), measured side by side in one run:
``--rounds`` rounds alternate the arms' order (bare first, then capture first, ...), and the median
and range of the per-round ratios are printed (the load of a shared machine moves between arms; one
pair is not a measurement).

    python benchmarks/capture_overhead.py [--quick] [--hidden 512] [--layers 8] [--samples 256]
    [--dtype float32]
                                          [--rounds 3] [--threads N]

The target is a randomly initialised Llama of the given size saved with the tiny tokenizer (weights
do not change the cost). "bare" runs ``HFBackend.forward`` over the planned batches and moves the
states to CPU; "capture" runs ``capture_shard`` on a regen shard holding the same samples (read,
plan, forward, quarantine checks, part files, the writer thread streaming them into the final shard
with byte-sized row groups). ``--threads`` sets torch's intra-op threads (default: torch's choice,
one per core), to see how the forward and the writer thread share cores.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import add_target_options, benchmark_parser, start_torch

from eagle3.capture.hf import HFBackend
from eagle3.capture.shard import capture_shard, plan_batches
from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.data.parquet import ShardWriter
from eagle3.regen.schema import REGEN_SCHEMA
from eagle3.rundir.runroot import wait_removals


def build_target(out: Path, *, hidden: int, layers: int) -> Path:
    """A random Llama of the given size + the tiny byte-level BPE tokenizer, saved under ``out``."""
    from eagle3.worlds.conversations import generate_conversations
    from eagle3.worlds.tiny_target import build_model, build_tokenizer

    tokenizer = build_tokenizer([m["content"] for c in generate_conversations(200) for m in c])
    model = build_model(
        tokenizer,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=max(hidden // 64, 2),
        num_kv_heads=max(hidden // 128, 1),
        intermediate_size=hidden * 3,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def make_config(
    model_dir: Path, root: Path, *, hidden: int, layers: int, dtype: str, vocab: int
) -> PipelineConfig:
    base = PipelineConfig(
        name="bench",
        root=str(root),
        target=TargetConfig(
            model_path=str(model_dir), num_layers=layers, hidden_size=hidden, vocab_size=vocab
        ),
    )
    return with_overrides(
        base,
        [
            f"capture.dtype={dtype}",
            "capture.batch_tokens=8192",
            "capture.max_seq_len=2048",
            "capture.row_group_bytes=67108864",
        ],
    )


def make_regen_shard(
    out_dir: Path, n: int, vocab: int, *, seed: int = 0
) -> tuple[Path, list[list[int]]]:
    """Random token sequences (lengths 64-1024) written as regen shard 0."""
    rng = random.Random(seed)
    seqs = [[rng.randrange(5, vocab) for _ in range(rng.randint(64, 1024))] for _ in range(n)]
    rows = [
        {
            "sample_id": f"s{i}",
            "input_ids": s,
            "loss_mask": [int(j > len(s) // 3) for j in range(len(s))],
            "status": "ok",
        }
        for i, s in enumerate(seqs)
    ]
    with ShardWriter(out_dir, REGEN_SCHEMA, start_index=0) as writer:
        writer.write_rows(rows)
        (info,) = writer.close()
    return info.path, seqs


def bare_forward(backend: HFBackend, seqs: list[list[int]], batch_tokens: int) -> float:
    start = time.perf_counter()
    for batch in plan_batches([len(s) for s in seqs], batch_tokens):
        for aux, last in backend.forward([seqs[i] for i in batch]):
            aux.cpu(), last.cpu()
    return time.perf_counter() - start


def main() -> None:
    parser = benchmark_parser(__doc__, quick="small model and few samples (< 1 min)")
    add_target_options(parser, hidden=512, layers=8, samples=256)
    args = parser.parse_args()
    start_torch(args, quick=(256, 8, 12))
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model_dir = build_target(tmp_path / "model", hidden=args.hidden, layers=args.layers)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, args.dtype)
        ).to(args.device)
        config = make_config(
            model_dir,
            tmp_path / "root",
            hidden=args.hidden,
            layers=args.layers,
            dtype=args.dtype,
            vocab=model.config.vocab_size,
        )
        backend = HFBackend(model, config.sglang_layer_ids, hidden_size=args.hidden)
        regen, seqs = make_regen_shard(
            tmp_path / "regen" / "fp", args.samples, model.config.vocab_size
        )
        tokens = sum(len(s) for s in seqs)
        bare_forward(backend, seqs[:8], config.capture.batch_tokens)  # warm-up
        rounds = []
        for r in range(args.rounds):
            arms = {
                "bare": lambda: bare_forward(backend, seqs, config.capture.batch_tokens),
                "capture": lambda r=r: timed_capture(
                    config, regen, tmp_path / "features" / f"round{r}", backend
                ),
            }
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            seconds = {name: arms[name]() for name in order}
            rounds.append(
                {
                    "order": order,
                    **{f"{k}_tok_per_s": round(tokens / v) for k, v in seconds.items()},
                    "ratio": round(seconds["bare"] / seconds["capture"], 3),
                }
            )
            print(json.dumps({"round": r, **rounds[-1]}), flush=True)
    print(
        json.dumps(
            {
                "device": args.device,
                "dtype": args.dtype,
                "hidden": args.hidden,
                "layers": args.layers,
                "samples": args.samples,
                "tokens": tokens,
                "torch_threads": torch.get_num_threads(),
                "rounds": len(rounds),
                "bare_tok_per_s": spread([r["bare_tok_per_s"] for r in rounds]),
                "capture_tok_per_s": spread([r["capture_tok_per_s"] for r in rounds]),
                "ratio_capture_over_bare": spread([r["ratio"] for r in rounds]),
                "goal": ">= 0.90 (median)",
            },
            indent=2,
        )
    )


def timed_capture(config: PipelineConfig, regen: Path, out_dir: Path, backend: HFBackend) -> float:
    start = time.perf_counter()
    capture_shard(config, regen, out_dir, backend=backend)
    seconds = time.perf_counter() - start
    # the parts' deletion, which overlaps the next shard in a capture: not into the next arm here
    wait_removals()
    # a round's shard is not needed after it is timed (full size: ~1 GB each)
    shutil.rmtree(out_dir)
    return seconds


def spread(values: list[float]) -> dict[str, float]:
    """Median and range over the rounds: a shared machine's load moves between the arms, so report
    the spread, never one pair."""
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


if __name__ == "__main__":
    main()
