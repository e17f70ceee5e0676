"""The reference server against real SGLang 0.5.23 on the same draft: speculative / baseline speedup
per concurrency on each engine, side by side in one run, and the reference server's scaling beside
its baseline's.

Four servers from one config through the one launcher (``build_launch``): a baseline and an EAGLE-3
arm on the reference engine and on SGLang (SGLang's two arms share ``SGLANG_MEMORY`` as the gate's
do). The gate's interleaved rounds measure all four (``eagle3.gate.rounds.measure_rounds``: per
round and level, every arm gets the gate prompts once after a warm-up and a cache flush, in arm
order on even rounds and reversed on odd ones). A speedup is the median over rounds of the per-round
ratio spec tok/s / baseline tok/s of one engine (min and max beside it); scaling is the median
per-round ratio of an arm's tok/s at concurrency c to its own at the first level. The reference
server must say what SGLang says: its speedup on the same side of 1.0 at every level, and its
speculative scaling at least 0.8 of its baseline's (batched verification, as SGLang's).

    python benchmarks/engine_conformance.py --draft <export dir> [--recipe tiny] [--levels 1 4 16]
    [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import tempfile
from pathlib import Path

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.gate.prompts import load_gate_prompts
from eagle3.gate.release import SGLANG_MEMORY
from eagle3.gate.report import ArmResult
from eagle3.gate.rounds import measure_rounds
from eagle3.recipes import resolve
from eagle3.serve.launch_commands import build_launch

ENGINES = ("reference", "sglang")


def _arms(
    config: PipelineConfig, draft: Path, logs: Path, stack: contextlib.ExitStack
) -> list[tuple[ArmResult, str]]:
    live = []
    for engine in ENGINES:
        cfg = config
        if engine == "sglang" and config.server.mem_fraction_static is None:
            cfg = with_overrides(
                config, [f"server.mem_fraction_static={round(SGLANG_MEMORY / 2, 3)}"]
            )
        for kind in ("baseline", "eagle3"):
            command = build_launch(
                cfg, kind, engine=engine, draft=None if kind == "baseline" else draft, port=0
            )
            server = stack.enter_context(
                command.server(log_path=logs / f"{engine}-{kind}.log", health_timeout_s=600)
            )
            role = "baseline" if kind == "baseline" else "candidate"
            live.append((ArmResult(f"{engine}:{kind}", role, server.url), server.url))
    return live


def _ratio(num: ArmResult, den: ArmResult, c_num: int, c_den: int) -> tuple[float, float, float]:
    """(median, min, max) over rounds of num's tok/s at ``c_num`` / den's at ``c_den``."""
    a, b = num.rounds_at(c_num), den.rounds_at(c_den)
    ratios = [a[r].output_tok_s / b[r].output_tok_s for r in sorted(a) if r in b]
    return statistics.median(ratios), min(ratios), max(ratios)


def _cell(ratio: tuple[float, float, float]) -> str:
    return f"{ratio[0]:.2f}x ({ratio[1]:.2f}-{ratio[2]:.2f})"


def report(arms: dict[str, ArmResult], levels: list[int]) -> None:
    print(
        "| engine | "
        + " | ".join(f"c={c} spec/baseline" for c in levels)
        + " | accept length (spec, pooled) |"
    )
    print("|---|" + "---|" * (len(levels) + 1))
    for engine in ENGINES:
        spec, base = arms[f"{engine}:eagle3"], arms[f"{engine}:baseline"]
        cells = [_cell(_ratio(spec, base, c, c)) for c in levels]
        accepts = [f"{lv.accept_length:.2f}" if lv.accept_length else "-" for lv in spec.levels]
        print(f"| {engine} | " + " | ".join(cells) + f" | {' / '.join(accepts)} |")
    print()
    first = levels[0]
    print(f"| reference server scaling vs c={first} | spec | baseline | spec / baseline |")
    print("|---|---|---|---|")
    spec, base = arms["reference:eagle3"], arms["reference:baseline"]
    for c in levels[1:]:
        s, b = _ratio(spec, spec, c, first), _ratio(base, base, c, first)
        print(f"| c={c} / c={first} | {_cell(s)} | {_cell(b)} | {s[0] / b[0]:.2f} |")
    for arm in arms.values():
        tok_s = ", ".join(f"c={lv.concurrency} {lv.output_tok_s:.0f}" for lv in arm.levels)
        print(f"{arm.name}: pooled tok/s {tok_s}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--draft", type=Path, required=True, help="A draft export dir for the recipe's target."
    )
    parser.add_argument("--recipe", default="tiny")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="Config override a.b=value."
    )
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    traffic = "{" + ", ".join(f"{c}: 1" for c in args.levels) + "}"
    config = resolve(
        args.recipe,
        [
            *args.overrides,
            f"gate.traffic={traffic}",
            f"gate.min_rounds={args.rounds}",
            f"gate.max_rounds={args.rounds}",
        ],
    )
    if config.server.max_running_requests < max(args.levels):
        raise SystemExit(
            f"server.max_running_requests={config.server.max_running_requests} < {max(args.levels)}"
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.target.model_path)
    prompts = load_gate_prompts(
        config.gate.prompt_sets, tokenizer, per_set=config.gate.prompts_per_set
    )
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        live = _arms(config, args.draft, Path(tmp), stack)
        measure_rounds(live, prompts, config.gate, keep_going=lambda: True)
    failed = [f"{arm.name}: {arm.error}" for arm, _ in live if arm.error]
    if failed:
        raise SystemExit("arms failed: " + "; ".join(failed))
    print(
        f"{len(prompts)} prompts x {config.gate.max_new_tokens} new tokens, {args.rounds} interleaved rounds"
    )
    report({arm.name: arm for arm, _ in live}, args.levels)


if __name__ == "__main__":
    main()
