"""Training worker entry: ``python -m eagle3.train``, one rank on stored or online features.

``python -m eagle3.train --config-yaml PATH (--features DIR | --regen DIR --ray-address A --broker
NAME) --vocab PATH --out DIR``. Started by the train stage (``eagle3.train.workers.worker_command``:
under torchrun for ``train.nproc > 1``, or directly for one process) on stored features
(``--features``) or online ones (``--regen``: this rank takes its batches from the run's broker).
Parses, builds, runs one rank (``eagle3.train.workers``). Logs on rank 0 only.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from eagle3.config.pipeline import load_yaml


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3.train", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--config-yaml", type=Path, required=True, help="resolved pipeline config (YAML)"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--features", type=Path, help="finished features stage directory")
    source.add_argument("--regen", type=Path, help="regen stage directory of an online run")
    parser.add_argument("--ray-address", help="online: the Ray cluster of the run's broker")
    parser.add_argument("--broker", help="online: the run's broker (a named Ray actor)")
    parser.add_argument(
        "--vocab", type=Path, required=True, help="vocab.safetensors (d2t, t2d, counts)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="draft output directory (ckpt/, metrics.jsonl)"
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override a.b=value"
    )
    args = parser.parse_args(argv)
    if args.regen is not None and not (args.ray_address and args.broker):
        parser.error("--regen needs --ray-address and --broker (the online run's broker)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    from eagle3.train.workers import run_worker, stored_batches, train_rank

    config = load_yaml(args.config_yaml, args.overrides)
    if args.regen is not None:
        from eagle3.train.online.source import broker_batches

        batches = broker_batches(
            config, args.regen, args.out, args.broker, ray_address=args.ray_address
        )
    else:
        batches = stored_batches(config, args.features)
    return run_worker(lambda: train_rank(config, args.vocab, args.out, batches), rank=rank)


if __name__ == "__main__":
    sys.exit(main())
