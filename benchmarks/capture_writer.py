"""The capture writer alone: the tokens per second ``PartWriter`` turns into part files and a
finished shard when nothing else runs, for a target's hidden size and the chosen encoding and codec.

    python benchmarks/capture_writer.py [--hidden 7168] [--encoding fp8_topk] [--compression lz4]
    [--batches 8]
                                        [--rounds 3] [--dir DIR]

A GPU forward hands the writer its states as fast as the GPU makes them, so this rate bounds a GPU
capture: a capture can run at most at ``writer tok/s / bare forward tok/s`` of the forward
(``capture_overhead.py --device cuda`` measures the forward). The batches are random states in their
stored form on the host, as ``eagle3.runtime.transfer.HostCopy`` leaves them (8 samples of 1,024
tokens each); they are built before the clock starts. Rounds write to a fresh directory under
``--dir`` (default: a temporary one; put it on the features disk). ``tail_s`` is the part after the
last batch was handed over (the last batches, the shard's footer and sync, the parts renamed aside):
the forward waits for it at the end of every shard.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from capture_overhead import spread

from eagle3.capture.encoding import ENCODINGS, column_codecs
from eagle3.capture.writer import Batch, PartWriter
from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.rundir.layout import parts_dir_name
from eagle3.rundir.runroot import wait_removals
from eagle3.runtime.transfer import HostCopy

SAMPLES, TOKENS, TOPK, VOCAB = 8, 1024, 256, 163_840


def make_batches(hidden: int, encoding: str, batches: int) -> list[Batch]:
    aux_codec, last_codec = column_codecs(encoding, "bfloat16", hidden, topk=TOPK)
    gen = torch.Generator().manual_seed(0)
    out = []
    for part in range(batches):
        states = []
        for _ in range(SAMPLES):
            aux = torch.randn(TOKENS, 3 * hidden, generator=gen).to(torch.bfloat16)
            if encoding == "fp8_topk":
                ids = torch.randint(0, VOCAB, (TOKENS, TOPK), generator=gen)
                last = last_codec.stored(
                    ids, torch.rand(TOKENS, TOPK, generator=gen).sort(-1, descending=True).values
                )
            else:
                last = last_codec.stored(torch.randn(TOKENS, hidden, generator=gen))
            states.append((aux_codec.stored(aux), last))
        samples = [
            {
                "sample_id": f"b{part}s{i}",
                "input_ids": list(range(TOKENS)),
                "loss_mask": [1] * TOKENS,
                "seq_len": TOKENS,
            }
            for i in range(SAMPLES)
        ]
        finite = torch.ones(SAMPLES, dtype=torch.bool)
        copies = HostCopy()
        copies.record()
        out.append(Batch(part, samples, states, (finite, finite), copies, tokens=SAMPLES * TOKENS))
    return out


def writer_config(
    root: str, hidden: int, *, encoding: str, compression: str, model_path: str = "unused"
) -> PipelineConfig:
    """A 61-layer target of ``hidden`` (Kimi-K2.5's depth) capturing in ``encoding`` with
    ``compression`` on the state columns; ``capture.device=cuda`` gives the writer thread normal
    priority, as on a GPU node."""
    return with_overrides(
        PipelineConfig(
            name="bench",
            root=root,
            target=TargetConfig(
                model_path=model_path, num_layers=61, hidden_size=hidden, vocab_size=VOCAB
            ),
        ),
        [
            f"capture.encoding={encoding}",
            f"capture.hidden_compression={compression}",
            f"capture.topk={TOPK}",
            "capture.dtype=bfloat16",
            "capture.device=cuda",
        ],
    )


def write_once(config: PipelineConfig, batches: list[Batch], out_dir: Path) -> tuple[float, float]:
    """(seconds for all of it, seconds of it after the last batch was handed over: what a capture's
    forward waits for at the end of each shard)."""
    (out_dir / parts_dir_name(0)).mkdir(parents=True)
    start = time.perf_counter()
    writer = PartWriter(config, 0, out_dir, {"benchmark": "capture_writer"}, [], None)
    for batch in batches:
        writer.submit(batch)
    handed = time.perf_counter()
    writer.finish([])
    end = time.perf_counter()
    # the parts' deletion: overlaps the next shard in a capture, not the next round here
    wait_removals()
    shutil.rmtree(out_dir)  # ~1.5 GB a round at the defaults
    return end - start, end - handed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hidden", type=int, default=7168, help="the target's hidden size (Kimi-K2.5: 7168)"
    )
    parser.add_argument("--encoding", default="fp8_topk", choices=ENCODINGS)
    parser.add_argument("--compression", default="lz4", choices=["none", "lz4", "zstd"])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the rounds write (default: a temp dir)"
    )
    args = parser.parse_args()
    batches = make_batches(args.hidden, args.encoding, args.batches)
    stored = sum(
        t.numel() * t.element_size() for b in batches for s in b.states for col in s for t in col
    )
    tokens = sum(b.tokens for b in batches)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        config = writer_config(
            tmp, args.hidden, encoding=args.encoding, compression=args.compression
        )
        seconds, tails = zip(
            *(write_once(config, batches, Path(tmp) / f"round{r}") for r in range(args.rounds)),
            strict=True,
        )
    print(
        json.dumps(
            {
                "hidden": args.hidden,
                "encoding": args.encoding,
                "compression": args.compression,
                "tokens": tokens,
                "stored_mib": round(stored / 2**20),
                "rounds": len(seconds),
                "writer_tok_per_s": spread([round(tokens / s) for s in seconds]),
                "writer_mib_per_s": round(stored / statistics.median(seconds) / 2**20),
                "tail_s": spread([round(t, 2) for t in tails]),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
