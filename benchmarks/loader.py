"""Loader (docs/DESIGN.md, "What the benchmarks measure"): train-step time with the Parquet
``FeatureDataset`` / with the same batches already in memory (goal <= 1.05), side by side in one
run, on a draft-like step (fc 3H->H, an MLP block, a projection to H; AdamW).

    python benchmarks/loader.py [--quick] [--hidden 512] [--rows 256] [--batch-size 4] [--encoding
    raw]
                                [--topk 256] [--codec zstd] [--prefetch N] [--rounds 3] [--device
                                cpu]

``--rounds`` rounds alternate which arm runs first (the load of a shared machine moves between
arms); the median and range of the per-round ratios are printed.

Feature shards hold random bf16 states in ``--encoding`` with ``--codec`` on the state columns (the
loader's cost does not depend on their values); batches come out as float32 on ``--device`` as the
trainer consumes them there: on the CPU the reader thread decodes fp8, on a GPU (``--device cuda``)
the batch is copied in its stored form and decoded there, and the in-memory arm holds its batches on
that GPU already. ``fp8_topk`` (the large recipes' default) stores random top-``--topk`` ids and
descending probabilities instead of the final state, and the step's loss becomes a soft
cross-entropy of a k-way projection against them. The shards have a manifest listing their footer
hashes, as capture writes it, so the loader checks their sizes and footers when it is built and each
page's CRC32 as it reads it (``eagle3.rundir.integrity``): both are timed with the loader's epoch.
Reported alone, side by side: the footer check, the page checks (an epoch's reads with and without
them), and the whole-file sha256 pass the loader made before (and still makes for shards listed
without footer hashes).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
from capture_overhead import spread
from torch import nn

from eagle3.capture.encoding import ENCODINGS, TopKCodec, column_codecs, encoding_topk
from eagle3.capture.schema import FEATURE_SCHEMA, feature_table, footer_metadata
from eagle3.capture.writer import feature_compression
from eagle3.config.capture import CaptureConfig
from eagle3.data.parquet import ShardWriter
from eagle3.rundir.integrity import damaged_files
from eagle3.rundir.runroot import FileEntry, Manifest
from eagle3.train.data import FeatureDataset


def write_features(
    out: Path, rows: int, hidden: int, *, encoding: str, codec: str, topk: int = 256, seed: int = 0
) -> list[Path]:
    rng = random.Random(seed)
    aux_codec, last_codec = column_codecs(encoding, "bfloat16", hidden, topk=topk)
    meta = footer_metadata(
        target_model="bench",
        target_revision=None,
        hidden_size=hidden,
        num_layers=8,
        layer_ids=[2, 4, 5],
        dtype="bfloat16",
        encoding=encoding,
        chat_template_hash="-",
        system_prompt_policy="keep",
        truncation="quarantine",
        max_seq_len=4096,
        features_fingerprint="bench",
        topk=encoding_topk(encoding, topk),
    )
    compression = feature_compression(codec)
    with ShardWriter(
        out,
        FEATURE_SCHEMA,
        rows_per_shard=max(rows // 2, 1),
        row_group_bytes=16 * 2**20,
        metadata=meta,
        compression=compression,
    ) as writer:
        for i in range(rows):
            n = rng.randint(128, 1024)
            writer.write_table(
                feature_table(
                    [
                        {
                            "sample_id": f"s{i}",
                            "input_ids": [rng.randrange(2048) for _ in range(n)],
                            "loss_mask": [1] * n,
                            "seq_len": n,
                            "aux_hidden": aux_codec.encode(torch.randn(n, 3 * hidden)),
                            "last_hidden": final_state(last_codec, n, hidden),
                        }
                    ]
                )
            )
        infos = writer.close()
    files = [
        FileEntry.of(i.path, rows=i.rows, base=out, sha256=i.sha256, footer_sha256=i.footer_sha256)
        for i in infos
    ]
    Manifest("features", out.name, files=files).write(out)
    return [info.path for info in infos]


def final_state(codec, n: int, hidden: int) -> bytes:
    """The stored final-state value of an ``n``-token row: random states, or random top-k ids with
    descending probabilities for ``fp8_topk``."""
    if isinstance(codec, TopKCodec):
        probs = torch.rand(n, codec.k).softmax(-1).sort(dim=-1, descending=True).values
        return codec.encode(torch.randint(0, 2**20, (n, codec.k)), probs)
    return codec.encode(torch.randn(n, hidden))


class DraftLike(nn.Module):
    def __init__(self, hidden: int, topk: int | None = None) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * hidden, hidden, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 3 * hidden), nn.SiLU(), nn.Linear(3 * hidden, hidden)
        )
        self.out = nn.Linear(hidden, topk or hidden)

    def forward(self, aux: torch.Tensor) -> torch.Tensor:
        x = self.fc(aux)  # [B, T, 3H] -> [B, T, H]
        return self.out(x + self.mlp(x))  # [B, T, H], or [B, T, k] logits against a stored top-k


def step_loss(pred: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    mask = (batch["loss_mask"] & batch["attention_mask"]).unsqueeze(-1)
    if "target_probs" in batch:
        per_token = -(batch["target_probs"] * pred.log_softmax(-1))
    else:
        per_token = (pred - batch["last_hidden"]) ** 2
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def run(batches, model: DraftLike, optimizer: torch.optim.Optimizer) -> tuple[float, int]:
    device = next(model.parameters()).device
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    synchronize()
    start, steps = time.perf_counter(), 0
    for batch in batches:
        loss = step_loss(model(batch["aux_hidden"]), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
    synchronize()  # a GPU step is asynchronous: time it to its end
    return time.perf_counter() - start, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--encoding", default="raw", choices=ENCODINGS)
    parser.add_argument(
        "--topk", type=int, default=CaptureConfig().topk, help="k of fp8_topk (capture.topk)"
    )
    parser.add_argument("--codec", default="zstd", choices=["none", "lz4", "zstd"])
    parser.add_argument(
        "--prefetch",
        type=int,
        default=None,
        help="batches a thread collates ahead (0: on the step's thread; default: the loader's, 0 on a "
        "CPU, 2 on a GPU)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds (>= 3 for a spread)"
    )
    parser.add_argument(
        "--device", default="cpu", help="where the step runs and batches are decoded (cpu, cuda)"
    )
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.rows = 256, 32
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_features(
            Path(tmp),
            args.rows,
            args.hidden,
            encoding=args.encoding,
            codec=args.codec,
            topk=args.topk,
        )
        make = lambda: FeatureDataset(  # noqa: E731
            paths,
            batch_size=args.batch_size,
            seed=0,
            hidden_dtype=torch.float32,
            prefetch=args.prefetch,
            device=args.device,
        )
        first = make()
        memory = list(first)
        model = DraftLike(args.hidden, encoding_topk(args.encoding, args.topk)).to(args.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        run(memory[:2], model, optimizer)  # warm-up
        rounds = []
        for r in range(args.rounds):
            arms = {
                "memory": lambda: run(memory, model, optimizer)[0],
                "loader": lambda: loader_epoch(make, len(memory), model, optimizer),
            }
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            seconds = {name: arms[name]() for name in order}
            rounds.append(
                {
                    "order": order,
                    **{
                        f"step_ms_{k}": round(1000 * v / len(memory), 2) for k, v in seconds.items()
                    },
                    "ratio": round(seconds["loader"] / seconds["memory"], 3),
                }
            )
            print(json.dumps({"round": r, **rounds[-1]}), flush=True)
        whole_s = min(timed(lambda: damaged_files(paths)) for _ in range(3))
        footers_s = min(timed(lambda: damaged_files(paths, pages_checked=True)) for _ in range(3))
        reads = {
            checked: min(timed(lambda c=checked: read_all(paths, c)) for _ in range(3))
            for checked in (0, 1)
        }
        shard_bytes = sum(p.stat().st_size for p in paths)
    loader_s = statistics.median(r["step_ms_loader"] for r in rounds) * len(memory) / 1000
    print(
        json.dumps(
            {
                "hidden": args.hidden,
                "rows": args.rows,
                "steps": len(memory),
                "batch_size": args.batch_size,
                "encoding": args.encoding,
                "codec": args.codec,
                "prefetch": first.prefetch,
                "rounds": len(rounds),
                "device": args.device,
                "step_ms_in_memory": spread([r["step_ms_memory"] for r in rounds]),
                "step_ms_loader": spread([r["step_ms_loader"] for r in rounds]),
                "ratio_loader_over_memory": spread([r["ratio"] for r in rounds]),
                "goal": "<= 1.05 (median)",
                "shard_mb": round(shard_bytes / 2**20, 1),
                "loader_epoch_s": round(loader_s, 3),
                "footer_check_s": round(footers_s, 4),
                "page_checks_s": round(reads[1] - reads[0], 3),
                "reads_s": {"unchecked": round(reads[0], 3), "checked": round(reads[1], 3)},
                "whole_file_sha256_s": round(whole_s, 3),
                "whole_file_share_of_loader_epoch": round(whole_s / loader_s, 4),
                "whole_file_mb_per_s": round(shard_bytes / whole_s / 2**20, 1),
            },
            indent=2,
        )
    )


def read_all(paths: list[Path], checked: bool) -> None:
    """Every row group of ``paths`` read as the loader reads them, with or without page checksum
    verification."""
    for path in paths:
        handle = pq.ParquetFile(
            path, memory_map=True, pre_buffer=True, page_checksum_verification=checked
        )
        for rg in range(handle.metadata.num_row_groups):
            handle.read_row_group(rg)


def loader_epoch(make, steps: int, model: DraftLike, optimizer: torch.optim.Optimizer) -> float:
    """Seconds for one epoch through a freshly built loader, its build (the footer checks)
    included."""
    start = time.perf_counter()
    loader = make()  # checks every shard's size and footer against the manifest
    _, loader_steps = run(loader, model, optimizer)
    assert loader_steps == steps
    return time.perf_counter() - start


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
