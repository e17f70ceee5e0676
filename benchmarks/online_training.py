"""Online vs stored training on the same rows, and the transport under it.

    python benchmarks/online_training.py [--rows 48] [--epochs 2] [--batch-size 4] [--out
    result.json] python benchmarks/online_training.py --transport [--batches 64] [--batch-mib 16]
    [--max-inflight 8] [--trainer-s 0]

Training (default): regen shards of the tiny world (``--rows`` conversations in 2 shards); the
stored path captures them with the ``hf`` backend into feature shards, then trains; the online path
trains with one producer actor capturing the same batches. Reported side by side: wall seconds
(capture + train for stored, train for online), training tokens/s (the trainer's own
``tokens_per_s``), peak disk of features, peak RSS of this process and of the Ray workers. Same
config, same seed: the final losses are printed to show they are the same run.

Transport: the broker and Ray's object store alone: one producer process puts ``--batches`` batches
of ``--batch-mib`` MiB through ``Broker.deliver``, the trainer takes them in order; MB/s end to end,
the most batches the store held at once (must be <= ``--max-inflight``), and the process RSS.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import resource
import tempfile
import time
from pathlib import Path
from typing import Any


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _ray_workers_rss_mib() -> float:
    import psutil

    total = 0
    for p in psutil.process_iter(["name", "cmdline", "memory_info"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "ray::" in (p.info["name"] or "") or "ray::" in cmd or "default_worker.py" in cmd:
            total += p.info["memory_info"].rss
    return total / 2**20


def _world(root: Path, rows: int, epochs: int, batch_size: int):
    from transformers import AutoConfig, AutoTokenizer

    from eagle3.config.pipeline import PipelineConfig, with_overrides
    from eagle3.config.target import TargetConfig
    from eagle3.data.parquet import ShardWriter
    from eagle3.data.template import render_conversation
    from eagle3.recipes import eagle3_home
    from eagle3.regen.schema import REGEN_SCHEMA
    from eagle3.worlds.conversations import generate_conversations
    from eagle3.worlds.world import TinyWorldSpec, build_tiny_world

    world, _ = build_tiny_world(eagle3_home() / "cache", TinyWorldSpec())
    model_dir = Path(world.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    regen = root / "regen" / "fp-bench"
    convs = generate_conversations(rows, seed=5)
    half = rows // 2
    for index, chunk in enumerate([convs[:half], convs[half:]]):
        out = []
        for conv in chunk:
            r = render_conversation(tokenizer, conv)
            out.append(
                {
                    "sample_id": hashlib.sha256(r.text.encode()).hexdigest()[:16],
                    "source": "b",
                    "messages": conv,
                    "input_ids": r.input_ids,
                    "loss_mask": r.loss_mask,
                    "status": "ok",
                }
            )
        with ShardWriter(regen, REGEN_SCHEMA, start_index=index) as writer:
            writer.write_rows(out)
    hf = AutoConfig.from_pretrained(model_dir)
    base = PipelineConfig(
        name="bench-online",
        root=str(root),
        target=TargetConfig(
            model_path=str(model_dir),
            num_layers=hf.num_hidden_layers,
            hidden_size=hf.hidden_size,
            vocab_size=hf.vocab_size,
            context_length=1024,
            dtype="float32",
        ),
    )
    config = with_overrides(
        base,
        [
            "capture.dtype=float32",
            "capture.batch_tokens=2048",
            "capture.row_group_bytes=262144",
            "vocab.draft_vocab_size=256",
            "train.precision=fp32",
            "train.device=cpu",
            "train.save_every=1000",
            "train.log_every=1000",
            f"train.epochs={epochs}",
            f"train.batch_size={batch_size}",
            "train.ttt_steps=3",
        ],
    )
    return config, regen


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def bench_training(rows: int, epochs: int, batch_size: int) -> dict[str, Any]:
    import torch

    from eagle3.capture.manifest import finalize_features
    from eagle3.capture.shard import capture_shard, features_fingerprint, read_regen_shard
    from eagle3.train.online.run import train_in_process
    from eagle3.train.workers import train
    from eagle3.worlds.distil import write_draft_vocab

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config, regen = _world(root, rows, epochs, batch_size)
        samples = [s for p in sorted(regen.glob("shard-*.parquet")) for s in read_regen_shard(p)]
        vocab = write_draft_vocab(
            [(s.input_ids, s.loss_mask) for s in samples],
            vocab_size=config.target.vocab_size,
            draft_vocab_size=256,
            path=root / "vocab.safetensors",
        )
        features = root / "features" / features_fingerprint(config, regen.name)
        started = time.monotonic()
        for shard in sorted(regen.glob("shard-*.parquet")):
            capture_shard(config, shard, features)
        finalize_features(config, features, [0, 1])
        captured = time.monotonic()
        stored = train(config, features, vocab, root / "stored")
        stored_done = time.monotonic()
        stored_rss = _rss_mib()
        online = train_in_process(config, regen, vocab, root / "online")
        online_done = time.monotonic()
        return {
            "rows": len(samples),
            "tokens": sum(len(s.input_ids) for s in samples),
            "epochs": epochs,
            "stored": {
                "capture_s": round(captured - started, 1),
                "train_s": round(stored_done - captured, 1),
                "tokens_per_s": round(stored["tokens_per_s"], 1),
                "final_loss": stored["final_loss"],
                "features_disk_bytes": _dir_bytes(features),
                "peak_rss_mib": round(stored_rss),
            },
            "online": {
                "train_s": round(online_done - stored_done, 1),
                "tokens_per_s": round(online["tokens_per_s"], 1),
                "final_loss": online["final_loss"],
                "features_disk_bytes": 0,
                "peak_rss_mib": round(_rss_mib()),
                "store": {
                    k: online["store"][k] for k in ("delivered", "consumed", "duplicates", "ready")
                },
            },
        }


def bench_transport(
    batches: int, batch_mib: int, max_inflight: int, trainer_s: float
) -> dict[str, Any]:
    import numpy as np
    import ray

    from eagle3.train.online.transport import connect, get_broker, open_broker, take

    connect(None)
    name = "broker-transport-bench"
    open_broker(name, total=batches, world_size=1, max_inflight=max_inflight, claim_timeout_s=600)

    @ray.remote(num_cpus=0)
    def producer(n: int, mib: int) -> int:
        from eagle3.train.online.broker import DONE, WAIT

        broker = get_broker(name)
        payload = np.random.default_rng(0).integers(0, 255, mib * 2**20, dtype=np.uint8)
        ray.get(broker.register.remote("p0"))
        sent = 0
        while (index := ray.get(broker.claim.remote("p0", 1.0))) != DONE:
            if index != WAIT:
                ray.get(broker.deliver.remote("p0", index, index, {"rows": [payload]}))
                sent += 1
        return sent

    broker = get_broker(name)
    started = time.monotonic()
    done = producer.remote(batches, batch_mib)
    held = 0
    for i in range(batches):
        # a slower trainer: the store fills to its bound and the producer waits
        time.sleep(trainer_s)
        held = max(held, ray.get(broker.status.remote())["ready"])
        _, message = take(broker, 0, i)
        assert message["rows"][0].nbytes == batch_mib * 2**20
        del message
    elapsed = time.monotonic() - started
    ray.get(done)
    status = ray.get(broker.status.remote())
    ray.kill(broker)
    out = {
        "batches": batches,
        "batch_mib": batch_mib,
        "mb_per_s": round(batches * batch_mib * 1.048576 / elapsed, 1),
        "trainer_s": trainer_s,
        "max_held": held,
        "max_inflight": max_inflight,
        "left_in_store": status["ready"],
        "driver_peak_rss_mib": round(_rss_mib()),
        "ray_workers_rss_mib": round(_ray_workers_rss_mib()),
    }
    ray.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--transport", action="store_true")
    parser.add_argument("--batches", type=int, default=64)
    parser.add_argument("--batch-mib", type=int, default=16)
    parser.add_argument("--max-inflight", type=int, default=8)
    parser.add_argument(
        "--trainer-s", type=float, default=0.0, help="transport: seconds the trainer takes a batch"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.transport:
        result = bench_transport(args.batches, args.batch_mib, args.max_inflight, args.trainer_s)
    else:
        result = bench_training(args.rows, args.epochs, args.batch_size)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
