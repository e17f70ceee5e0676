"""``python -m eagle3.regen``: run the regen stage in this process, without Prefect.

Used by the resume test (which kills it with SIGKILL) and by the benchmarks; users run ``eagle3
regen``, which runs the Prefect flow. Prints the stage summary as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from eagle3.recipes import resolve
from eagle3.regen.stage import RegenStage
from eagle3.stage import UnitsFailed, run_stage


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eagle3.regen", description=__doc__)
    p.add_argument("--config", type=Path, default=None, help="YAML config (default: the recipe).")
    p.add_argument("--recipe", default="tiny")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], help="a.b=value override"
    )
    p.add_argument("--prompts", type=Path, required=True, help="A finished prompts stage dir.")
    p.add_argument("--shards", type=int, nargs="*", default=None, help="Only these shard ids.")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = resolve(args.config or args.recipe, args.overrides)
    try:
        result = run_stage(RegenStage(), config, prompts_dir=args.prompts, shard_ids=args.shards)
    except UnitsFailed as exc:
        logging.getLogger(__name__).error("%s", exc)
        return 1
    sys.stdout.write(json.dumps(result.summary) + "\n")
    return 0 if result.done else 1


if __name__ == "__main__":
    sys.exit(main())
