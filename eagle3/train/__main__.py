"""Training worker entry: ``python -m eagle3.train --config-yaml PATH --features DIR --vocab PATH --out DIR``.

Started by ``torchrun`` (``eagle3 train --nproc N``, ``infra/train.sh``) or directly for one process. Parses,
builds, runs, and always cleans up the process group (``train`` does). Logs on rank 0 only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from eagle3.config.pipeline import load_yaml
from eagle3.errors import DATA_ERROR_EXIT, DATA_ERROR_PREFIX, DataError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m eagle3.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config-yaml", type=Path, required=True, help="resolved pipeline config (YAML)")
    parser.add_argument("--features", type=Path, required=True, help="finished features stage directory")
    parser.add_argument("--vocab", type=Path, required=True, help="vocab.safetensors (d2t, t2d, counts)")
    parser.add_argument("--out", type=Path, required=True, help="draft output directory (ckpt/, metrics.jsonl)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override a.b=value")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    from eagle3.train.trainer import train

    config = load_yaml(args.config_yaml, args.overrides)
    try:
        summary = train(config, args.features, args.vocab, args.out)
    except DataError as exc:  # one line the parent recognises; no traceback: the message is the whole story
        print(f"{DATA_ERROR_PREFIX}{exc}", file=sys.stderr, flush=True)
        return DATA_ERROR_EXIT
    if rank == 0:
        logging.getLogger("eagle3.train").info("summary %s", json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
