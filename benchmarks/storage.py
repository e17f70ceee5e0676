"""Storage (DESIGN §9): feature bytes per token / 8*H (the per-sample bf16 ``.ckpt`` baseline; goal <= 1.0), and
read throughput of our Parquet shards against the same data saved as one ``torch.save`` file per sample, in one run.

    python benchmarks/storage.py [--quick] [--hidden 512] [--samples 128]

Captures bf16 features from a random Llama (``capture_overhead.build_target``), measures the shard's bytes per
token, then reads every row back as tensors both ways (ours: ``binary_tensors`` over the row groups; peer: a
``torch.load(weights_only=True)`` per sample file). Kimi-K2.5 (H=7168) is computed from the measured compression.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
from capture_overhead import build_target, make_config, make_regen_shard

from eagle3.capture.hf import HFBackend
from eagle3.capture.run import capture_shard
from eagle3.capture.schema import binary_tensors

KIMI_H = 7168


def read_ours(path: Path, hidden: int) -> int:
    pf, tokens = pq.ParquetFile(path), 0
    for rg in range(pf.num_row_groups):
        table = pf.read_row_group(rg)
        aux = binary_tensors(table.column("aux_hidden"), "bfloat16", 3 * hidden)
        last = binary_tensors(table.column("last_hidden"), "bfloat16", hidden)
        assert len(aux) == len(last)
        tokens += sum(a.shape[0] for a in aux)
    return tokens


def to_per_sample_files(path: Path, out: Path, hidden: int) -> int:
    """The field's layout: one torch.save file per sample (aux, last, input_ids, loss_mask)."""
    out.mkdir()
    table = pq.read_table(path)
    aux = binary_tensors(table.column("aux_hidden"), "bfloat16", 3 * hidden)
    last = binary_tensors(table.column("last_hidden"), "bfloat16", hidden)
    ids, masks, size = table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist(), 0
    for i in range(table.num_rows):
        file = out / f"data_{i}.ckpt"
        torch.save({"aux_hidden_states": aux[i].clone(), "hidden_states": last[i].clone(),
                    "input_ids": torch.tensor(ids[i]), "loss_mask": torch.tensor(masks[i])}, file)
        size += file.stat().st_size
    return size


def read_peer(out: Path) -> int:
    return sum(torch.load(f, weights_only=True)["aux_hidden_states"].shape[0] for f in sorted(out.glob("*.ckpt")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--samples", type=int, default=128)
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.samples = 256, 12
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model_dir = build_target(tmp_path / "model", hidden=args.hidden, layers=8)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        config = make_config(model_dir, tmp_path / "root", hidden=args.hidden, layers=8, dtype="bfloat16",
                             vocab=model.config.vocab_size)
        regen, seqs = make_regen_shard(tmp_path / "regen" / "fp", args.samples, model.config.vocab_size)
        result = capture_shard(config, regen, tmp_path / "features" / "fp",
                               backend=HFBackend(model, config.sglang_layer_ids))
        shard = Path(result["path"])
        tokens = sum(len(s) for s in seqs)
        per_token = shard.stat().st_size / tokens
        peer_bytes = to_per_sample_files(shard, tmp_path / "ckpt", args.hidden)
        timings = {}
        readers = {"ours": lambda: read_ours(shard, args.hidden), "peer": lambda: read_peer(tmp_path / "ckpt")}
        for name, fn in readers.items():
            fn()  # warm the page cache for both
            start = time.perf_counter()
            assert fn() == tokens
            timings[name] = tokens / (time.perf_counter() - start)
    state_bytes = 8 * args.hidden
    compression = (per_token - 5) / state_bytes  # measured: stored state bytes per raw bf16 state byte
    kimi = (8 * KIMI_H * compression + 5) / (8 * KIMI_H)
    print(json.dumps({
        "hidden": args.hidden, "tokens": tokens, "bytes_per_token": round(per_token, 1),
        "ratio_bytes_per_token_over_8H": round(per_token / state_bytes, 4), "goal": "<= 1.0",
        "peer_ckpt_bytes_per_token": round(peer_bytes / tokens, 1),
        "kimi_k2_5_8H_bytes": 8 * KIMI_H, "kimi_k2_5_ratio_computed": round(kimi, 4),
        "read_tok_per_s_ours": round(timings["ours"]), "read_tok_per_s_per_sample_torch_save": round(timings["peer"]),
        "read_ratio_ours_over_peer": round(timings["ours"] / timings["peer"], 2),
    }, indent=2))


if __name__ == "__main__":
    main()
