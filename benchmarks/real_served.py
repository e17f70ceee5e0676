"""Served traffic on the real target: SmolLM2-135M-Instruct answering ShareGPT prompts with SGLang's
request logging on, then ``served_vs_public.py`` on those logs against as many public prompts
regenerated.

    PYTHONPATH=.:benchmarks python benchmarks/real_served.py [--requests 192] [--concurrency 8]
        [--seeds 0,1,2] [--max-new 64] [--work DIR] [--out result.json]

Traffic: the last ``--requests`` whole conversations of the ShareGPT file the ``smollm2`` recipe
trains on (their first user turn, through ``/v1/chat/completions``, greedy, at most the recipe's
``regen.max_new_tokens``), sent at ``--concurrency`` to the reference server serving the target with
request logging at level 3: the logs a team serving this model would have. The served recipe
(``<work>/smollm2_served.yaml``) is the ``smollm2`` recipe with those logs as its only source, a
tenth held out as the gate's prompts, and answers cut at the budget kept (``served.keep_truncated``,
as regen keeps them, so both arms train on the same kind of rows). ``served_vs_public.py`` then
trains one draft on the served rows and one on as many ShareGPT prompts drawn by the recipe's mix
and regenerated, and measures both greedily on the held-out served prompts (``--max-new`` tokens).
The public arm draws from the whole file, the traffic from its end; the script counts the held-out
prompts the public arm trained on (the exact first user turn), which should be none.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from eagle3.data.readers import iter_rows
from eagle3.data.served_log import log_flags
from eagle3.recipes import resolve, world_cache
from eagle3.serve.launch import reference_server
from eagle3.worlds.served_traffic import send_requests
from eagle3.worlds.world import world_builders

REPO = Path(__file__).resolve().parents[1]


def first_turns(sharegpt: Path, count: int) -> list[str]:
    """The first user turn of the last ``count`` whole ShareGPT conversations that have one."""
    turns = []
    for row in iter_rows([sharegpt]):
        if row.error is None and isinstance(row.value, dict):
            messages = row.value.get("conversations") or []
            human = [m.get("value", "") for m in messages if m.get("from") == "human"]
            if human and human[0].strip():
                turns.append(human[0])
    return turns[-count:]


def chat(prompt: str, max_new: int) -> dict[str, Any]:
    """A greedy chat request for ``prompt`` (body and headers)."""
    messages = [{"role": "user", "content": prompt}]
    body = {"model": "default", "messages": messages, "max_tokens": max_new, "temperature": 0}
    return {"body": body, "headers": {}}


def build_traffic(args: argparse.Namespace) -> Path:
    """Serve the traffic once into ``<work>/logs`` (kept: a re-run reuses it); the log dir."""
    logs = args.work / "logs"
    done = args.work / "traffic.json"
    if done.is_file():
        return logs
    config = resolve("smollm2", [f"root={args.work / 'probe'}"])
    world_builders()["smollm2"](world_cache())
    prompts = first_turns(Path(config.sources[0].path), args.requests)
    extra = [
        "--max-running-requests",
        str(args.concurrency),
        "--dtype",
        config.target.dtype,
        "--num-threads",
        "1",
        *log_flags(logs),
    ]
    model = config.target.model_path
    with reference_server(model, extra_args=extra, log_path=args.work / "server.log") as server:
        requests = [("/v1/chat/completions", chat(p, config.regen.max_new_tokens)) for p in prompts]
        statuses = asyncio.run(
            send_requests(server.url, requests, (args.concurrency,), timeout_s=1800)
        )
    done.write_text(json.dumps({"requests": len(prompts), "statuses": statuses}) + "\n")
    print(f"traffic: {len(prompts)} requests, statuses {statuses}", flush=True)
    return logs


def served_recipe(args: argparse.Namespace, logs: Path) -> Path:
    """``smollm2`` with the logs as its only source, as a YAML recipe file."""
    config = resolve("smollm2", [f"root={args.work / 'probe'}"])
    served = config.replace(
        name="smollm2_served",
        sources=[config.sources[0].replace(adapter="served", name="served", path=str(logs))],
        mix=config.mix.replace(total=None),
        served=config.served.replace(held_out=0.1, keep_truncated=True),
        gate=config.gate.replace(profile="served", prompt_sets={}),
    )
    path = args.work / "smollm2_served.yaml"
    path.write_text(served.to_yaml())
    return path


def public_overlap(work: Path, seed: int, held_out: list[str]) -> int:
    """Held-out prompts (exact first user turn) among the public arm's normalized prompts."""
    import pyarrow.parquet as pq

    seen = set()
    for shard in (work / f"public-{seed}" / "prompts").glob("*/shard-*.parquet"):
        for messages in pq.read_table(shard, columns=["messages"]).column(0).to_pylist():
            seen.update(m["content"] for m in messages if m["role"] == "user")
    return sum(prompt in seen for prompt in held_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-new", type=int, default=64, help="tokens per held-out prompt")
    parser.add_argument("--work", type=Path, default=REPO / ".cache" / "real-served")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    recipe = served_recipe(args, build_traffic(args))
    argv = [
        sys.executable,
        str(Path(__file__).with_name("served_vs_public.py")),
        *("--served-recipe", str(recipe), "--public-recipe", "smollm2"),
        *("--seeds", args.seeds, "--max-new", str(args.max_new)),
        # the traffic was answered greedily: the public arm regenerates the same way (the served
        # arm skips regen, so this moves nothing of its own)
        *("--set", "regen.temperature=0"),
        *("--work", str(args.work), "--resume", str(args.work)),
        *(("--out", str(args.out)) if args.out else ()),
    ]
    subprocess.run(argv, check=True)
    held = held_out_prompts(args.work)
    for seed in (int(s) for s in args.seeds.split(",")):
        print(
            f"seed {seed}: {public_overlap(args.work, seed, held)} of {len(held)} held-out "
            "prompts in the public arm's prompts"
        )


def held_out_prompts(work: Path) -> list[str]:
    """The first user turn of every held-out served prompt (the served arm of seed 0's profile)."""
    from eagle3.gate.served_profile import load_profile

    config = resolve(work / "smollm2_served.yaml", [f"root={work / 'served-0'}"])
    lines = Path(load_profile(config).prompt_set).read_text().splitlines()
    rows: list[dict[str, Any]] = [json.loads(line) for line in lines]
    return [next(m["content"] for m in r["messages"] if m["role"] == "user") for r in rows]


if __name__ == "__main__":
    main()
