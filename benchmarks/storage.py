"""Storage (docs/DESIGN.md, "What the benchmarks measure"): feature bytes per token / 8*H (the
per-sample bf16 ``.ckpt`` baseline; goal <= 1.0, and <= 0.40 for the compact encodings), and read
throughput of our Parquet shards against the same data saved as one ``torch.save`` file per sample
(goal >= 1.0), for each encoding x hidden-column codec, in one run.

    python benchmarks/storage.py [--quick] [--hidden 512] [--samples 128] [--rounds 3]
    [--row-group-mib 64]

Captures bf16 features from a random Llama (``capture_overhead.build_target``) once with
``capture_shard``, then re-encodes the same states with every ``capture.encoding`` (the capture's
own codec; ``fp8_topk`` takes the top ``--topk`` of the target's ``lm_head`` over the captured final
state, as capture does) and every hidden-column codec (none, lz4, zstd) into shards written like the
merge writes them. For each: bytes per token, and tokens/s reading every row back as tensors in the
stored form (what the loader copies and moves to the training device; fp8 decodes there) and, for
fp8, also decoded to bf16 on the CPU; the peer reads a ``torch.load(weights_only=True)`` per sample
file. Kimi-K2.5 (H=7168) is computed per column: each state column's measured compression ratio
times its size at H=7168 (the top-k column does not grow with H; a random target's near-uniform
top-k compresses worse than a trained one's, so its ratio here is a pessimistic one). Read
throughput is timed in ``--rounds`` rounds per variant, each reading ours and the peer's files in
alternating order after a warm-up read of both (page cache hot), and reported as the median and
range of the per-round ratios; the default 128 samples (~70K tokens) keep one read well above timer
and scheduling noise. ``--row-group-mib`` takes several sizes (comma-separated) to choose the
writer's row-group size by measurement.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch
from capture_overhead import build_target, make_config, make_regen_shard, spread

from eagle3.capture.encoding import (
    ENCODINGS,
    TOKEN_OVERHEAD_BYTES,
    ColumnCodec,
    FinalCodec,
    TopKCodec,
    column_codecs,
    dequantize,
)
from eagle3.capture.head import target_topk
from eagle3.capture.hf import HFBackend
from eagle3.capture.schema import FEATURE_SCHEMA, feature_table
from eagle3.capture.shard import capture_shard
from eagle3.capture.writer import feature_compression
from eagle3.config.capture import CaptureConfig
from eagle3.data.parquet import ShardWriter, shard_metadata
from eagle3.train.feature_reader import iter_row_groups, open_features

KIMI_H = 7168
CODECS = ("none", "lz4", "zstd")


def read_ours(path: Path, codecs: tuple[ColumnCodec, FinalCodec], *, decode: bool) -> int:
    """Every row as tensors, opened and read as the loader does (``open_features``,
    ``iter_row_groups``)."""
    file, tokens = open_features(path), 0
    for decoded in iter_row_groups(((file, rg) for rg in range(file.num_row_groups)), codecs):
        aux, last = decoded.aux, decoded.last
        assert len(aux) == len(last)
        if decode:
            aux = [
                (dequantize(v, s, torch.bfloat16), None) if s is not None else (v, s)
                for v, s in aux
            ]
            # what the loader hands the loss: int64 ids, float32 probs
            if isinstance(codecs[1], TopKCodec):
                last = [(ids.long(), probs.float()) for ids, probs in last]
            else:
                last = [
                    (dequantize(v, s, torch.bfloat16), None) if s is not None else (v, s)
                    for v, s in last
                ]
        tokens += sum(a.shape[0] for a, _ in aux)
    return tokens


def transcode(
    raw: Path,
    out: Path,
    encoding: str,
    codec: str,
    hidden: int,
    row_group_bytes: int,
    *,
    lm_head: torch.Tensor,
    topk: int,
) -> Path:
    """The raw bf16 shard re-encoded with ``encoding`` and written with ``codec`` on the two state
    columns."""
    raw_aux, raw_last = column_codecs("raw", "bfloat16", hidden)
    aux_codec, last_codec = column_codecs(encoding, "bfloat16", hidden, topk=topk)
    table = pq.read_table(raw)
    rows = table.drop_columns(["aux_hidden", "last_hidden"]).to_pylist()
    for row, (a, _), (b, _) in zip(
        rows,
        raw_aux.views(table.column("aux_hidden")),
        raw_last.views(table.column("last_hidden")),
        strict=True,
    ):
        row["aux_hidden"] = aux_codec.encode(a)
        row["last_hidden"] = (
            last_codec.encode(*target_topk(b, lm_head, topk))
            if isinstance(last_codec, TopKCodec)
            else last_codec.encode(b)
        )
    compression = feature_compression(codec)
    meta = {
        **shard_metadata(raw),
        "encoding": encoding,
        **({"topk": str(topk)} if encoding == "fp8_topk" else {}),
    }
    with ShardWriter(
        out, FEATURE_SCHEMA, row_group_bytes=row_group_bytes, metadata=meta, compression=compression
    ) as writer:
        writer.write_table(feature_table(rows))
        (info,) = writer.close()
    return info.path


def timed(tokens: int, fn: Callable[[], int]) -> float:
    """Tokens/s of ``fn()`` (which returns the tokens it read)."""
    start = time.perf_counter()
    assert fn() == tokens
    return tokens / (time.perf_counter() - start)


def read_ratio(
    tokens: int, ours: Callable[[], int], peer: Callable[[], int], rounds: int
) -> dict[str, Any]:
    """Median and range of ours/peer read throughput over ``rounds`` rounds, alternating which arm
    reads first."""
    ours(), peer()  # warm the page cache of both
    ratios, peer_tps = [], []
    for r in range(rounds):
        if r % 2 == 0:
            mine, theirs = timed(tokens, ours), timed(tokens, peer)
        else:
            theirs, mine = timed(tokens, peer), timed(tokens, ours)
        ratios.append(mine / theirs)
        peer_tps.append(theirs)
    return {**spread(ratios), "peer_tok_per_s": round(statistics.median(peer_tps))}


def to_per_sample_files(path: Path, out: Path, hidden: int) -> int:
    """The field's layout: one torch.save file per sample (aux, last, input_ids, loss_mask)."""
    out.mkdir()
    table = pq.read_table(path)
    raw_aux, raw_last = column_codecs("raw", "bfloat16", hidden)
    aux = [v for v, _ in raw_aux.views(table.column("aux_hidden"))]
    last = [v for v, _ in raw_last.views(table.column("last_hidden"))]
    ids, masks, size = (
        table.column("input_ids").to_pylist(),
        table.column("loss_mask").to_pylist(),
        0,
    )
    for i in range(table.num_rows):
        file = out / f"data_{i}.ckpt"
        torch.save(
            {
                "aux_hidden_states": aux[i].clone(),
                "hidden_states": last[i].clone(),
                "input_ids": torch.tensor(ids[i]),
                "loss_mask": torch.tensor(masks[i]),
            },
            file,
        )
        size += file.stat().st_size
    return size


def read_peer(out: Path) -> int:
    return sum(
        torch.load(f, weights_only=True)["aux_hidden_states"].shape[0]
        for f in sorted(out.glob("*.ckpt"))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument(
        "--row-group-mib", default="64", help="row-group sizes to compare, e.g. 16,64,256"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating read rounds per variant (>= 3)"
    )
    parser.add_argument(
        "--topk", type=int, default=CaptureConfig().topk, help="k of fp8_topk (capture.topk)"
    )
    args = parser.parse_args()
    row_groups = [int(m) for m in args.row_group_mib.split(",")]
    if args.quick:
        args.hidden, args.samples = 256, 12
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model_dir = build_target(tmp_path / "model", hidden=args.hidden, layers=8)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        config = make_config(
            model_dir,
            tmp_path / "root",
            hidden=args.hidden,
            layers=8,
            dtype="bfloat16",
            vocab=model.config.vocab_size,
        )
        regen, seqs = make_regen_shard(
            tmp_path / "regen" / "fp", args.samples, model.config.vocab_size
        )
        result = capture_shard(
            config,
            regen,
            tmp_path / "features" / "fp",
            backend=HFBackend(model, config.sglang_layer_ids),
        )
        tokens = sum(len(s) for s in seqs)
        peer_bytes = to_per_sample_files(Path(result["path"]), tmp_path / "ckpt", args.hidden)
        peer = partial(read_peer, tmp_path / "ckpt")
        rows = []
        lm_head = model.get_output_embeddings().weight.detach()
        for encoding in ENCODINGS:
            codecs = column_codecs(encoding, "bfloat16", args.hidden, topk=args.topk)
            for codec in CODECS:
                for mib in row_groups:
                    shard = transcode(
                        Path(result["path"]),
                        tmp_path / f"{encoding}-{codec}-{mib}",
                        encoding,
                        codec,
                        args.hidden,
                        mib * 2**20,
                        lm_head=lm_head,
                        topk=args.topk,
                    )
                    per_token = shard.stat().st_size / tokens
                    row = {
                        "encoding": encoding,
                        "codec": codec,
                        "row_group_mib": mib,
                        "bytes_per_token": round(per_token, 1),
                        "over_8H": round(per_token / (8 * args.hidden), 4),
                        "kimi_over_8H": round(kimi_ratio(shard, tokens, encoding, args.topk), 4),
                        "read_over_peer": read_ratio(
                            tokens,
                            partial(read_ours, shard, codecs, decode=False),
                            peer,
                            args.rounds,
                        ),
                    }
                    if encoding != "raw":
                        row["read_decode_cpu_over_peer"] = read_ratio(
                            tokens,
                            partial(read_ours, shard, codecs, decode=True),
                            peer,
                            args.rounds,
                        )
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    shutil.rmtree(shard.parent)
    print(
        json.dumps(
            {
                "hidden": args.hidden,
                "tokens": tokens,
                "rounds": args.rounds,
                "topk": args.topk,
                "peer_ckpt_bytes_per_token": round(peer_bytes / tokens, 1),
                "goals": "over_8H <= 0.40 (compact), read_over_peer median >= 1.0",
                "variants": rows,
            },
            indent=2,
        )
    )


def kimi_ratio(shard: Path, tokens: int, encoding: str, topk: int) -> float:
    """Kimi-K2.5's bytes/token over 8*H: each state column's compressed bytes measured here, scaled
    by the ratio of that column's uncompressed size at H=7168 to its size here (ids and masks stay
    ~5 bytes)."""
    meta = pq.ParquetFile(shard).metadata
    hidden = int(shard_metadata(shard)["hidden_size"])
    here = dict(
        zip(
            ("aux_hidden", "last_hidden"),
            column_codecs(encoding, "bfloat16", hidden, topk=topk),
            strict=True,
        )
    )
    kimi = dict(
        zip(
            ("aux_hidden", "last_hidden"),
            column_codecs(encoding, "bfloat16", KIMI_H, topk=topk),
            strict=True,
        )
    )
    stored = 0.0
    for rg in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            column = meta.row_group(rg).column(c)
            name = column.path_in_schema
            if name in here:
                stored += (
                    column.total_compressed_size
                    * kimi[name].bytes_per_token
                    / here[name].bytes_per_token
                )
    return (stored / tokens + TOKEN_OVERHEAD_BYTES) / (8 * KIMI_H)


if __name__ == "__main__":
    main()
