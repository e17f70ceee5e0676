"""Online trainer worker: ``python -m eagle3.train.online --config-yaml P --regen DIR --vocab P --out DIR --ray-address A
--broker NAME``: one trainer rank taking its batches from the run's broker (``eagle3.train.online.run``)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from eagle3.config.pipeline import load_yaml
from eagle3.errors import DATA_ERROR_EXIT, DATA_ERROR_PREFIX, DataError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3.train.online", description=__doc__.splitlines()[0])
    for flag in ("--config-yaml", "--regen", "--vocab", "--out"):
        parser.add_argument(flag, type=Path, required=True)
    parser.add_argument("--ray-address", required=True)
    parser.add_argument("--broker", required=True)
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    from eagle3.train.online.plan import OnlinePlan
    from eagle3.train.online.source import OnlineBatchSource
    from eagle3.train.online.transport import connect, get_broker
    from eagle3.train.distributed import cleanup_distributed, init_distributed
    from eagle3.train.trainer import load_inputs, train_on_source

    config = load_yaml(args.config_yaml, [])
    connect(args.ray_address)
    info = init_distributed(config.train.device)
    try:
        plan = OnlinePlan.for_night(config, args.regen, world_size=info.world_size)
        source = OnlineBatchSource(plan, get_broker(args.broker), rank=info.rank, log_dir=args.out)
        summary = train_on_source(config, source, load_inputs(config, args.vocab), args.out, info)
    except DataError as exc:
        print(f"{DATA_ERROR_PREFIX}{exc}", file=sys.stderr, flush=True)
        return DATA_ERROR_EXIT
    finally:
        cleanup_distributed()
    if rank == 0:
        logging.getLogger("eagle3.train.online").info("summary %s", json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
