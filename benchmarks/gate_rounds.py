"""The gate's interleaved rounds vs a single pass, side by side in one run, on the tiny world (CPU,
reference arms).

A single pass (what the gate did before rounds: each arm once per level, after a warm-up and a cache
flush) is the same gate with one round per level; it cannot decide (an interval needs two rounds)
and is timed only as the reference. Both run ``run_gate`` end to end (static preflight, launches,
runtime preflight, measuring, report), with ``force`` and without promoting, alternately
``--repeat`` times. Prints the wall times, their ratio, the rounds the verdict took and its
interval.

    python benchmarks/gate_rounds.py --draft <export dir> [--recipe tiny] [--set gate.max_rounds=4]
    [--repeat 1]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

from eagle3.config.pipeline import PipelineConfig
from eagle3.gate.release import GateRequest, run_gate
from eagle3.recipes import resolve


def _single_pass(config: PipelineConfig) -> PipelineConfig:
    """One round per level; ``model_copy`` skips the validator that requires two (this run only
    times it)."""
    gate = config.gate.model_copy(update={"min_rounds": 1, "max_rounds": 1})
    return config.model_copy(update={"gate": gate})


def _timed(
    config: PipelineConfig, draft: Path, root: Path
) -> tuple[float, str, int, list[float] | None]:
    config = config.model_copy(update={"root": str(root)})
    start = time.perf_counter()
    result = run_gate(config, GateRequest(drafts=[draft], promote=False, force=True))
    wall = time.perf_counter() - start
    (decision,) = result.report.decisions
    return wall, str(decision.verdict), decision.rounds, decision.speedup_interval


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--draft", type=Path, required=True, help="A draft export dir for the recipe's target."
    )
    parser.add_argument("--recipe", default="tiny")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="Config override a.b=value."
    )
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = resolve(args.recipe, args.overrides)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            single, *_ = _timed(_single_pass(config), args.draft, Path(tmp) / f"single{i}")
            rounds, verdict, n, interval = _timed(config, args.draft, Path(tmp) / f"rounds{i}")
            span = f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "-"
            print(
                f"single pass {single:.1f} s | rounds {rounds:.1f} s ({n} rounds over the traffic profile, "
                f"{verdict.upper()}, speedup interval {span}) | ratio {rounds / single:.2f}"
            )


if __name__ == "__main__":
    main()
