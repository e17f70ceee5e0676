"""Aiming by served acceptance vs uniform nights (``scaling.aim: served``), on
``aimed_scaling.py``'s protocol.

    PYTHONPATH=.:benchmarks python benchmarks/served_aimed.py [--quick] [--seeds 20,21,22]
    [--traffic 8] [--out result.json] [--resume DIR]

The world, the pool, the shared start, the nights, the budget and the score are
``aimed_scaling.py``'s (four domains of ``eagle3.worlds.domains_world`` at equal traffic shares;
each night a fresh draft on every row selected so far; scored by the serving-mix accept length on a
held-out eval set per domain). What differs is the policy compared with uniform: after each night
its draft *serves* the day's traffic (``--traffic`` fresh prompts per domain, never in the pool or
the eval set) on the reference server with speculation and SGLang's request logging at level 1 (no
prompt, no answer: only ``meta_info``), each request tagged with its domain in the
``x-smg-routing-key`` header; the per-domain accept length is read back from the logs
(``eagle3.scaling.served_accept.served_accept``) and the next night's budget is split by
``allocate_headroom`` (floor 0.1, then share x (num_steps + 1 - served accept)). Reported as
``aimed_scaling.py`` does: per seed and as mean with 95% t intervals over seeds, the accept lengths
after the last night and the paired difference served - uniform.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from aimed_scaling import Run, World, interval, seed_world, spread
from common import publish, resumable

from eagle3.config.gate import SpeculativeConfig
from eagle3.data.served_log import log_files, log_flags
from eagle3.data.template import render_prompt
from eagle3.scaling.allocation import DomainState
from eagle3.scaling.served_accept import allocate_headroom, served_accept
from eagle3.serve.launch import reference_server
from eagle3.serve.launch_commands import speculative_args
from eagle3.worlds.domains_world import DOMAINS, build_domains_world, domain_prompts

HEADER = "x-smg-routing-key"


def serve_day(
    world: World, export: Path, *, prompts: int, day: int, steps: int, work: Path
) -> dict[str, float]:
    """The day's traffic served by ``export`` with speculation and request logging at level 1; the
    per-domain served accept length read back from the logs."""
    import aiohttp

    logs = work / f"logs-{day}"
    spec = SpeculativeConfig(num_steps=steps, num_draft_tokens=steps + 1)
    flags = ["--num-threads", "1", "--max-running-requests", "8", "--dtype", "float32"]
    flags += [*speculative_args(spec, str(export)), *log_flags(logs, level=1)]
    traffic = [
        (d, render_prompt(world.tokenizer, [c[0]]))
        for d in DOMAINS
        for c in domain_prompts(d, prompts, seed=7000 + 97 * world.seed + day)
    ]

    async def send(url: str) -> None:
        slots = asyncio.Semaphore(8)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:

            async def one(domain: str, ids: list[int]) -> None:
                body = {
                    "input_ids": ids,
                    "sampling_params": {"max_new_tokens": world.max_new, "temperature": 0},
                }
                async with (
                    slots,
                    session.post(url + "/generate", json=body, headers={HEADER: domain}) as resp,
                ):
                    assert resp.status == 200, await resp.text()
                    await resp.read()

            await asyncio.gather(*(one(d, ids) for d, ids in traffic))

    with reference_server(
        world.model_dir, extra_args=flags, log_path=work / f"server-{day}.log"
    ) as server:
        asyncio.run(send(server.url))
    measured = served_accept(log_files(logs), header=HEADER)
    return {d: measured[d].accept_length for d in DOMAINS}


class ServedRun(Run):
    """The ``served`` policy: tomorrow's rows by the headroom of today's served acceptance."""

    def select(self, budget: int) -> dict[str, int]:
        assert self.export is not None
        day = len(self.nights)
        served = serve_day(
            self.world,
            self.export,
            prompts=self.args.traffic,
            day=day,
            steps=self.args.steps,
            work=self.work / f"served-{day}",
        )
        self.nights[-1]["served_by_domain"] = served
        tokens = self.domain_tokens()
        states = [
            DomainState(
                name=d,
                pool_left=len(self.world.rows[d]) - self.taken[d],
                tokens_per_row=tokens[d] / max(self.taken[d], 1),
                share=1 / len(DOMAINS),
                accept=served[d],
            )
            for d in DOMAINS
        ]
        rows = allocate_headroom(
            states, budget, unit="tokens", floor=0.1, ceiling=self.args.steps + 1
        ).rows()
        print(
            f"  served  night {day}: served accept "
            f"{ ({d: round(a, 2) for d, a in served.items()}) } -> {rows}",
            flush=True,
        )
        return rows


def run_seed(model_dir: Path, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    world, start = seed_world(model_dir, seed, args)
    work = Path(tempfile.mkdtemp(prefix=f"eagle3-served-aimed-{seed}-"))
    runs = {
        "uniform": Run(world, "uniform", start, work, args),
        "served": ServedRun(world, "served", start, work, args),
    }
    print(f"seed {seed}: start {start}", flush=True)
    first = runs["uniform"].night(0, dict.fromkeys(DOMAINS, 0))
    runs["served"].nights.append(dict(first))
    runs["served"].export = runs["uniform"].export
    for index in range(1, args.nights + 1):
        for run in runs.values():
            run.night(index, run.select(args.budget))
    uniform, served = runs["uniform"].nights, runs["served"].nights
    return {
        "seed": seed,
        "wall_s": round(time.monotonic() - started, 1),
        "uniform": uniform,
        "served": served,
        "uniform_final_accept": uniform[-1]["accept"],
        "served_final_accept": served[-1]["accept"],
        "uniform_tokens": uniform[-1]["tokens"] - uniform[0]["tokens"],
        "served_tokens": served[-1]["tokens"] - served[0]["tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, 3 nights, smaller sets")
    parser.add_argument(
        "--seeds", default=None, help="comma-separated seeds (default 20,21,22; --quick 20,21)"
    )
    parser.add_argument("--traffic", type=int, default=8, help="served prompts per domain and day")
    for name in ("nights", "pool", "eval", "start", "budget", "epochs"):
        parser.add_argument(f"--{name}", type=int, default=None, help="as in aimed_scaling.py")
    parser.add_argument(
        "--max-new", dest="max_new", type=int, default=None, help="answer and eval tokens"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--resume", type=Path, default=None, help="keep finished seeds here; reuse them"
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    quick = dict(
        seeds="20,21", nights=3, pool=160, eval=8, start=32, budget=1200, epochs=3, max_new=48
    )
    full = dict(
        seeds="20,21,22", nights=4, pool=240, eval=12, start=48, budget=1600, epochs=3, max_new=48
    )
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.steps, args.init, args.replay, args.lr_scale, args.max_share = 3, "scratch", 0.5, 0.5, 1.0
    torch.set_num_threads(args.threads)
    from eagle3.recipes import world_cache

    model_dir = build_domains_world(world_cache())
    names = ("nights", "pool", "eval", "start", "budget", "epochs", "max_new", "traffic")
    results = []
    for s in str(args.seeds).split(","):
        path = None if args.resume is None else args.resume / f"served-seed-{s}.json"
        key = {k: getattr(args, k) for k in names}
        results.append(resumable(path, key, lambda s=s: run_seed(model_dir, int(s), args)))
    diffs = [r["served_final_accept"] - r["uniform_final_accept"] for r in results]
    summary = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "uniform_final_accept": interval([r["uniform_final_accept"] for r in results], sign=""),
        "served_final_accept": interval([r["served_final_accept"] for r in results], sign=""),
        "served_minus_uniform": interval(diffs),
        "served_over_uniform_tokens": spread(
            [r["served_tokens"] / r["uniform_tokens"] for r in results]
        ),
        "per_night_difference": [
            interval([r["served"][n]["accept"] - r["uniform"][n]["accept"] for r in results])
            for n in range(1, args.nights + 1)
        ],
        "wall_s": [r["wall_s"] for r in results],
        "mean_wall_s": statistics.fmean(r["wall_s"] for r in results),
    }
    publish(summary, results, args.out)


if __name__ == "__main__":
    main()
