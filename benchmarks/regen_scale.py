"""Regen at scale: peak RSS of the regen client at 1M prompts / at 10K prompts (goal <= 1.2), and
Prefect's bookkeeping per shard at the real shard count as a fraction of one shard's work
(``--flow-overhead``).

The server is the reference server in synthetic mode (no model: a fixed number of cycling ids after
a small fixed delay), so the client is the bottleneck. Each size runs in a fresh process and its
peak RSS is read from ``getrusage``: ``--path library`` runs ``python -m eagle3.regen`` (the stage
runner the flow's tasks call), ``--path flow`` runs ``eagle3 regen`` (the command, the flow and a
task per shard) against a Prefect API server this script starts once, so the server's own memory is
not counted. ``--quick``: 2K vs 50K prompts.

``--flow-overhead N``: a plan of N shards of 2 prompts each (1M prompts are 500 shards of 2,000),
run by the library runner (``eagle3.stage.run_stage``) and by the regen flow (a task per shard,
against a Prefect API started before the clock starts), one after the other; (flow - library) / N is
the bookkeeping per shard, printed against the library's time for one real 2,000-prompt shard on the
same server (goal <= 0.05 of it).

    python benchmarks/regen_scale.py [--quick] [--path flow] [--sizes 10000 100000] [--flow-overhead
    500]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.config.regen import RegenConfig
from eagle3.config.target import TargetConfig
from eagle3.serve.launch import reference_server

sys.path.insert(0, str(Path(__file__).parent))
from regen_overhead import running_prefect, write_prompts


def build_tokenizer_dir(out: Path) -> Path:
    from eagle3.worlds.tiny_target import build_tokenizer

    build_tokenizer(
        [f"question {i} about topic {i % 11}" for i in range(500)], vocab_size=512
    ).save_pretrained(out)
    return out


def peak_rss_mb(
    config_path: Path, prompts: Path, env: dict[str, str] | None
) -> tuple[float, float]:
    """Peak RSS (MB) and wall time of one regen process: the library runner, or with ``env`` (a
    Prefect API to reuse) the ``eagle3 regen`` command."""
    code = (
        "import resource, subprocess, sys; "
        "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    runner = ["eagle3.regen"] if env is None else ["flows.cli", "regen"]
    cmd = [sys.executable, "-m", *runner, "--config", str(config_path), "--prompts", str(prompts)]
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code, *cmd], capture_output=True, text=True, check=True, env=env
    )
    rc, kb = out.stdout.split()
    if rc != "0":
        raise RuntimeError(f"regen client exited with {rc}")
    return int(kb) / 1024, time.perf_counter() - start


def scale_config(root: Path, tok: Path, url: str, run: str) -> PipelineConfig:
    return PipelineConfig(
        name="scale",
        root=str(root / run),
        target=TargetConfig(model_path=str(tok), num_layers=8, hidden_size=8, vocab_size=512),
        regen=RegenConfig(servers=[url], concurrency_per_server=64, max_new_tokens=8),
    )


@contextmanager
def prefect_calls() -> Iterator[Counter[str]]:
    """Count, for the block, every Prefect API request this process sends (``METHOD /route``, ids
    cut) and every event and log record it queues: counts do not depend on the machine's load, so
    they are the evidence of what a task run costs."""
    import re

    import httpx
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    counts: Counter[str] = Counter()
    saved = httpx.Client.send, httpx.AsyncClient.send, EventsWorker.send, APILogWorker.send

    def route(request: httpx.Request) -> str:
        path = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "{id}", request.url.path.split("/api", 1)[-1])
        return f"{request.method} {path}"

    def sync_send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        counts[route(request)] += 1
        return saved[0](self, request, **kwargs)

    async def async_send(
        self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any
    ) -> httpx.Response:
        counts[route(request)] += 1
        return await saved[1](self, request, **kwargs)

    def event_send(self: Any, item: Any) -> Any:
        counts[f"event {getattr(item, 'event', '?')}"] += 1
        return saved[2](self, item)

    def log_send(self: Any, item: Any) -> Any:
        counts["log record"] += 1
        return saved[3](self, item)

    httpx.Client.send, httpx.AsyncClient.send = sync_send, async_send  # type: ignore[method-assign]
    EventsWorker.send, APILogWorker.send = event_send, log_send  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        httpx.Client.send, httpx.AsyncClient.send, EventsWorker.send, APILogWorker.send = saved  # type: ignore


def flow_overhead(
    root: Path, tok: Path, url: str, shards: int, shard_size: int = 2_000
) -> dict[str, float]:
    """Seconds of Prefect bookkeeping per shard (flow minus library over ``shards`` 2-prompt shards)
    and the library's seconds for one ``shard_size``-prompt shard."""
    from eagle3.regen.stage import RegenStage
    from eagle3.stage import run_stage
    from flows.commands.common import prefect_api
    from flows.regen import regen_flow

    small = write_prompts(root / "fo-small", shards * 2, rows_per_shard=2)
    one = write_prompts(root / "fo-one", shard_size, rows_per_shard=shard_size)
    start = time.perf_counter()
    run_stage(RegenStage(), scale_config(root, tok, url, "fo-one"), prompts_dir=one)
    shard_s = time.perf_counter() - start
    start = time.perf_counter()
    run_stage(RegenStage(), scale_config(root, tok, url, "fo-lib"), prompts_dir=small)
    library_s = time.perf_counter() - start
    with prefect_api(), prefect_calls() as calls:
        start = time.perf_counter()
        regen_flow(scale_config(root, tok, url, "fo-flow"), prompts_dir=str(small))
        flow_s = time.perf_counter() - start
    per_shard = (flow_s - library_s) / shards
    print(
        json.dumps(
            {"prefect_calls_per_shard": {k: round(v / shards, 2) for k, v in calls.most_common()}},
            indent=2,
        )
    )
    return {
        "shards": shards,
        "library_s": round(library_s, 1),
        "flow_s": round(flow_s, 1),
        "bookkeeping_per_shard_s": round(per_shard, 3),
        f"one_{shard_size}_prompt_shard_s": round(shard_s, 1),
        "fraction": round(per_shard / shard_s, 4),
        "prefect_calls_per_shard": round(sum(calls.values()) / shards, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2K vs 50K prompts")
    parser.add_argument("--delay", type=float, default=0.002)
    parser.add_argument(
        "--sizes", type=int, nargs=2, default=None, help="Override: small and large prompt counts."
    )
    parser.add_argument(
        "--path",
        choices=("library", "flow"),
        default="library",
        help="library: python -m eagle3.regen; flow: the eagle3 regen command.",
    )
    parser.add_argument(
        "--flow-overhead",
        type=int,
        default=None,
        metavar="SHARDS",
        help="Prefect bookkeeping per shard over SHARDS shards (instead of memory).",
    )
    args = parser.parse_args()
    if args.flow_overhead:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            tok = build_tokenizer_dir(root / "tok")
            extra = ["--synthetic-tokens", "8", "--synthetic-delay", str(args.delay)]
            with reference_server(None, extra_args=extra) as server:
                result = flow_overhead(root, tok, server.url, args.flow_overhead)
        print(json.dumps(result, indent=2))
        print(
            f"prefect bookkeeping per shard / one 2,000-prompt shard = {result['fraction']:.4f}  (goal <= 0.05)"
        )
        return
    small, large = args.sizes or ((2_000, 50_000) if args.quick else (10_000, 1_000_000))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok = build_tokenizer_dir(root / "tok")
        extra = ["--synthetic-tokens", "8", "--synthetic-delay", str(args.delay)]
        results = {}
        env = {**os.environ, "PREFECT_HOME": str(root / "prefect")}
        api = running_prefect(env) if args.path == "flow" else contextlib.nullcontext(None)
        with reference_server(None, extra_args=extra) as server, api as flow_env:
            for n in (small, large):
                prompts = write_prompts(root / f"p{n}", n, rows_per_shard=2000)
                config = scale_config(root, tok, server.url, f"run{n}")
                path = root / f"config{n}.yaml"
                path.write_text(config.to_yaml())
                rss, wall = peak_rss_mb(path, prompts, flow_env)
                results[n] = {
                    "peak_rss_mb": round(rss, 1),
                    "wall_s": round(wall, 1),
                    "req_s": round(n / wall, 1),
                }
    ratio = results[large]["peak_rss_mb"] / results[small]["peak_rss_mb"]
    print(
        json.dumps(
            {
                "path": args.path,
                "small": small,
                "large": large,
                **{str(k): v for k, v in results.items()},
            },
            indent=2,
        )
    )
    print(
        f"regen memory ratio, {args.path} path (RSS at {large:,} / at {small:,} prompts) = {ratio:.3f}  "
        "(goal <= 1.2)"
    )


if __name__ == "__main__":
    main()
