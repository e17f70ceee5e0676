"""The seeds' question on a real model: accept length on MT-bench against the number of regenerated
ShareGPT conversations (SmolLM2-135M-Instruct), as consecutive nights through the pipeline's scaling
stage; and at equal size, a draft trained on regenerated answers against one trained on ShareGPT's
original answers.

    python benchmarks/real_scaling.py [--sizes 16 32 64 128] [--seeds 0 1 2] [--equal-size 64]
        [--eval-prompts 24] [--eval-tokens 64] [--temperature T] [--root DIR] [--set KEY=VALUE ...]
        [--quick] [--out result.json]

Per seed (``mix.seed`` and ``train.seed``: which conversations, and the draft's initialisation), one
run root:

* nights: ``eagle3 run --recipe smollm2 --scale <new rows>`` until the cumulative training set
  reaches each of ``--sizes`` (the prompts stage holds ``--pool`` conversations in shards of
  ``--shard``, so every size is whole shards); each night regenerates only its new shards, trains a
  fresh draft on every row so far and gates it on MT-bench, as the nightly deployment does. The
  night's point on the scaling curve (``curve.jsonl``) gives the gate's verdict, speedup and accept
  length (0 when its static preflight refused the draft unmeasured);
* each night's draft is also measured offline on the first ``--eval-prompts`` MT-bench questions
  (the project's speculative decoder, the HF target, greedy, ``--eval-tokens`` new tokens, 3 draft
  steps): an accept length for every size, whether or not the gate measured one;
* the original-answers arm: a second root, ``regen.answers=source`` (ShareGPT's own answers,
  rendered with the target's template, the first turn, as the regenerated rows), one night of
  ``--equal-size`` rows, gated and measured the same way.

``--temperature T`` adds a sampled profile to every night's gate (``gate.sampling``: T, top_p
0.95, reported beside the greedy verdict, which decides); the offline accept length is greedy. Results per (seed, size,
arm) are kept in ``--out``'s folder as they finish, and a run killed anywhere and started again
resumes: finished nights are skipped by the pipeline itself (their manifests), finished measurements
from those files.

Printed: per size, the offline accept length's mean and 90% t interval over seeds, and the gate's
verdicts and speedups; at equal size, regenerated - original per seed and its interval, with both
arms' verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import resumable

REPO = Path(__file__).resolve().parents[1]
CONFIDENCE = 0.9


def night(
    root: Path, scale: int, seed: int, args: argparse.Namespace, extra: list[str]
) -> dict[str, Any]:
    """One ``eagle3 run`` night on ``root`` growing the training set by ``scale``; its exit code and
    wall time."""
    sets = [
        f"root={root}",
        f"mix.total={args.pool}",
        f"mix.seed={seed}",
        f"train.seed={seed}",
        f"normalize.shard_size={args.shard}",
        *extra,
        *args.set,
    ]
    if args.temperature is not None:
        sampled = {"temperature": args.temperature, "top_p": 0.95, "decides": False}
        sets.append(f"gate.sampling={json.dumps({'greedy': {}, 'sampled': sampled})}")
    argv = [
        str(Path(sys.executable).parent / "eagle3"),
        "run",
        "--recipe",
        "smollm2",
        "--scale",
        str(scale),
    ]
    for item in sets:
        argv += ["--set", item]
    start = time.perf_counter()
    log = root.parent / f"{root.name}-night-{scale}-{int(time.time())}.log"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        done = subprocess.run(
            argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy()
        )
    if done.returncode not in (0, 1, 3):  # 0 PASS, 1 refused, 3 inconclusive: all measurements
        raise SystemExit(f"night on {root} failed (exit {done.returncode}): see {log}")
    return {
        "exit": done.returncode,
        "wall_s": round(time.perf_counter() - start, 1),
        "log": str(log),
    }


def last_point(root: Path) -> dict[str, Any]:
    from eagle3.scaling.curve import read_curve

    point = read_curve(root)[-1]
    return {
        "total_prompts": point.total_prompts,
        "train_samples": point.train_samples,
        "gate_accept": point.accept_length,
        "speedup": point.speedup,
        "passed": point.passed,
        "draft": point.draft_fingerprint,
        "report": point.report,
    }


def gate_verdict(report: str) -> str:
    return str(json.loads(Path(report).read_text()).get("verdict", "fail")).upper()


def offline_accept(root: Path, draft_fp: str, args: argparse.Namespace) -> float:
    """The draft's accept length on the first ``--eval-prompts`` MT-bench questions (greedy, 3
    steps)."""
    import torch

    from eagle3.gate.offline_accept import evaluate_acceptance, load_prompt_file
    from eagle3.recipes import resolve
    from eagle3.serve.reference.spec_decoder import SpeculativeDecoder
    from eagle3.target_io import load_causal_lm, load_tokenizer

    config = resolve("smollm2", [f"root={root}"])
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(config.target)
    target = load_causal_lm(config.target, dtype=torch.float32).eval()
    export = root / "drafts" / draft_fp / "export"
    decoder = SpeculativeDecoder(target, tokenizer, export, config.speculative.num_steps, "eagle3")
    prompts = load_prompt_file(
        Path(config.gate.prompt_sets["mt_bench"]), tokenizer, limit=args.eval_prompts
    )
    eos = [tokenizer.eos_token_id]
    result = evaluate_acceptance(decoder, prompts, max_new_tokens=args.eval_tokens, eos_ids=eos)
    return round(float(result["accept_length"]), 4)


def measure(
    root: Path, scale: int, seed: int, args: argparse.Namespace, extra: list[str]
) -> dict[str, Any]:
    ran = night(root, scale, seed, args, extra)
    point = last_point(root)
    verdict = gate_verdict(point["report"])
    return {
        **ran,
        **point,
        "verdict": verdict,
        "offline_accept": offline_accept(root, point["draft"], args),
    }


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"sizes": {}, "original": None}
    root, done = args.root / f"seed-{seed}", 0
    for size in args.sizes:
        key = {"seed": seed, "size": size, "arm": "regen", **_key(args)}
        path = args.out.parent / f"seed-{seed}-regen-{size}.json"
        out["sizes"][str(size)] = resumable(
            path, key, lambda s=size, d=done: measure(root, s - d, seed, args, [])
        )
        done = size
    key = {"seed": seed, "size": args.equal_size, "arm": "source", **_key(args)}
    path = args.out.parent / f"seed-{seed}-source-{args.equal_size}.json"
    source = args.root / f"seed-{seed}-source"
    out["original"] = resumable(
        path, key, lambda: measure(source, args.equal_size, seed, args, ["regen.answers=source"])
    )
    return out


def _key(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "pool": args.pool,
        "shard": args.shard,
        "eval_prompts": args.eval_prompts,
        "eval_tokens": args.eval_tokens,
        "temperature": args.temperature,
        "set": args.set,
    }


def interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its two-sided ``CONFIDENCE`` t interval (a point for one
    value)."""
    from eagle3.gate.stats import t_quantile

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = t_quantile(0.5 + CONFIDENCE / 2, len(values) - 1) * statistics.stdev(values)
    half /= len(values) ** 0.5
    return mean, mean - half, mean + half


def report(results: dict[int, dict[str, Any]], args: argparse.Namespace) -> None:
    header = "| conversations | offline accept, mean [90% interval] | verdicts | speedup | rows |"
    print(f"\n{header}\n|---:|---|---|---|---:|")
    for size in args.sizes:
        cells = [r["sizes"][str(size)] for r in results.values()]
        mean, low, high = interval([c["offline_accept"] for c in cells])
        verdicts = ", ".join(c["verdict"] for c in cells)
        speedups = ", ".join(f"{c['speedup']:.2f}x" if c["speedup"] else "-" for c in cells)
        rows = "/".join(str(c["train_samples"]) for c in cells)
        print(f"| {size} | {mean:.3f} [{low:.3f}, {high:.3f}] | {verdicts} | {speedups} | {rows} |")
    n = args.equal_size
    regen = [r["sizes"][str(n)]["offline_accept"] for r in results.values()]
    original = [r["original"]["offline_accept"] for r in results.values()]
    mean, low, high = interval([a - b for a, b in zip(regen, original, strict=True)])
    alone = interval(original)
    verdicts = ", ".join(
        f"{r['original']['verdict']} {r['original']['speedup']:.2f}x" for r in results.values()
    )
    print(
        f"\nat {n} conversations: regenerated - original answers {mean:+.3f} "
        f"[{low:+.3f}, {high:+.3f}]"
    )
    print(
        f"original answers alone {alone[0]:.3f} [{alone[1]:.3f}, {alone[2]:.3f}]; "
        f"verdicts {verdicts}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--equal-size", type=int, default=64)
    parser.add_argument("--pool", type=int, default=400, help="mix.total: conversations normalized")
    parser.add_argument(
        "--shard", type=int, default=16, help="normalize.shard_size: sizes are whole shards"
    )
    parser.add_argument("--eval-prompts", type=int, default=24)
    parser.add_argument("--eval-tokens", type=int, default=64)
    parser.add_argument(
        "--temperature", type=float, default=None, help="also gate at T, top_p 0.95 (reported)"
    )
    parser.add_argument("--root", type=Path, default=REPO / ".cache" / "real-scaling")
    parser.add_argument(
        "--out", type=Path, default=None, help="result JSON (default: <root>/result.json)"
    )
    parser.add_argument("--set", action="append", default=[], help="more overrides for every night")
    parser.add_argument(
        "--quick", action="store_true", help="sizes 16 32, one seed, 8 eval prompts"
    )
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.seeds, args.equal_size, args.pool = [16, 32], [0], 16, 64
        args.eval_prompts, args.eval_tokens = 8, 32
    args.out = args.out or args.root / "result.json"
    if args.equal_size not in args.sizes:
        raise SystemExit(f"--equal-size {args.equal_size} must be one of --sizes {args.sizes}")
    if any(s % args.shard for s in args.sizes):
        raise SystemExit(f"every size must be whole shards of --shard {args.shard}: {args.sizes}")
    results = {}
    for seed in args.seeds:
        results[seed] = run_seed(seed, args)
        print(f"seed {seed}: {json.dumps(results[seed])}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"args": _key(args) | {"sizes": args.sizes, "seeds": args.seeds}, "results": results},
            indent=1,
        )
    )
    report(results, args)


if __name__ == "__main__":
    main()
