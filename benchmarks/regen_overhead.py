"""Regen overhead: the regen library and the ``eagle3 regen`` command (the path users run) against a
bare saturating aiohttp client, end to end (goals: library >= 0.97, command >= 0.90 of the bare
client).

Same reference server (tiny target, greedy), same prompts (rendered once with the project's
renderer), same concurrency. Four arms per round, in an order that rotates every round so a drift of
the shared machine favours no arm: ``bare`` (a semaphore and one POST per prompt), ``library``
(``run_stage(RegenStage())`` in this process, tokenizer already loaded), ``command`` (``python -m
flows.cli regen`` in a fresh process: interpreter and imports, a temporary Prefect API server, the
flow, the tokenizer load: what a laptop user gets) and ``command_reused`` (the same with
``PREFECT_API_URL`` naming a server that is already running, started once by this script: what the
README's cluster path and a nightly deployment get). Each arm's tok/s is its completion tokens over
its wall time from start to exit. The pipeline arms' timeline, from their journals: the time to the
first completed sample (the start-up cost), the idle time between shards (one shard's last
completion to the next one's first) and the time from the last completion to the exit. Each arm's
CPU seconds are split by process: ``client`` (this process for the in-process arms; the command and
the temporary Prefect server it started and stopped for the command arms), ``server`` (the reference
server) and ``prefect`` (the reused Prefect server): on 2 cores, what the client spends before its
first request cannot overlap with the job. Prints per arm the median and range over the rounds, and
the per-round ratios to the bare client. Also the server's own scaling: bare tok/s at concurrency 1
vs the benchmark's concurrency.

``--specforge DIR`` adds SpecForge's ``regenerate_train_data.py`` (from a SpecForge checkout's
``scripts/`` folder; it needs the ``openai`` client in this interpreter: ``uv pip install -e
'.[peers]'``) as a fifth arm: the peer's regen command in a fresh process, the same prompts as
ShareGPT JSONL through the server's ``/v1/chat/completions`` (the server applies the same chat
template), the same concurrency and greedy length. It writes text, not token ids: its tokens are its
answers re-tokenized, and the script-to-script comparison is by wall time on the same work
(``wall_over_specforge``: the peer's wall / the arm's; > 1 is faster than the peer).

    python benchmarks/regen_overhead.py [--quick] [--rounds 3] [--specforge ../SpecForge/scripts]
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import psutil
from common import benchmark_parser

from eagle3.config.pipeline import PipelineConfig
from eagle3.config.regen import RegenConfig
from eagle3.config.target import TargetConfig
from eagle3.data.parquet import ShardWriter
from eagle3.data.schema import PROMPT_SCHEMA
from eagle3.data.template import render_prompt
from eagle3.regen.plan import regen_dir_for
from eagle3.regen.stage import RegenStage
from eagle3.rundir.runroot import FileEntry, Manifest, fingerprint
from eagle3.serve.launch import reference_server
from eagle3.stage import run_stage
from eagle3.target_io import TargetRef, load_tokenizer

# rotated every round (plus "specforge" when given)
ARMS = ("bare", "library", "command", "command_reused")
COMMAND_ARMS = ("command", "command_reused")
CPU_PARTS = ("client", "server", "prefect")  # whose CPU seconds ``cpu_seconds`` counts
# what ``Timeline`` reports of a pipeline arm
TIMELINE = ("first_s", "idle_between_shards_s", "after_last_s")


def build_target(out: Path) -> Path:
    from eagle3.worlds.tiny_target import build_model, build_tokenizer

    corpus = [
        f"user asks question {i} about topic {i % 11} and the assistant answers"
        for i in range(2000)
    ]
    tokenizer = build_tokenizer(corpus, vocab_size=1024)
    build_model(tokenizer, num_layers=4, max_position_embeddings=1024).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def write_prompts(root: Path, n: int, rows_per_shard: int) -> Path:
    fp = fingerprint("bench-prompts", n, rows_per_shard)
    out = root / "prompts" / fp
    rows = (
        {
            "sample_id": f"p{i:08d}",
            "source": "bench",
            "source_row": str(i),
            "n_user_turns": 1,
            "meta": "{}",
            "messages": [
                {"role": "user", "content": f"question {i} about topic {i % 11}, please answer"}
            ],
            "input_ids": None,
            "loss_mask": None,
        }
        for i in range(n)
    )
    with ShardWriter(out, PROMPT_SCHEMA, rows_per_shard=rows_per_shard) as writer:
        batch = []
        for row in rows:
            batch.append(row)
            if len(batch) == 5000:
                writer.write_rows(batch)
                batch = []
        writer.write_rows(batch)
    infos = writer.close()
    Manifest(
        stage="prompts",
        fingerprint=fp,
        files=[FileEntry.of(i.path, rows=i.rows, base=out) for i in infos],
    ).write(out)
    return out


async def bare_client(url: str, prompts: list[list[int]], params: dict, concurrency: int) -> int:
    """A minimal client: a semaphore, one POST per prompt, nothing else; returns the completion
    tokens."""
    gate = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(session: aiohttp.ClientSession, ids: list[int]) -> None:
        nonlocal tokens
        async with (
            gate,
            session.post(
                f"{url}/generate", json={"input_ids": ids, "sampling_params": params}
            ) as r,
        ):
            tokens += len((await r.json())["output_ids"])

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, ids) for ids in prompts))
    return tokens


class Timeline:
    """Each shard's first and last completed sample as seen in its journal, watched from a thread
    every 20 ms: the arm's time to its first completion, the idle time between one shard's last
    completion and the next one's first (summed over the shard boundaries: a Prefect wait between
    units shows here, e.g. a task-tag lease), and the time from the last completion to the arm's
    exit."""

    def __init__(self, regen_dir: Path, start: float) -> None:
        self.regen_dir, self.start = regen_dir, start
        self.spans: dict[str, list[float]] = {}  # journal name -> [first, last] seconds from start
        # journal name -> its size when last seen (it only grows, by whole lines)
        self.sizes: dict[str, int] = {}
        self.stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self.stop.is_set():
            now = time.perf_counter() - self.start
            for journal in self.regen_dir.glob("*.journal.jsonl"):
                try:
                    size = journal.stat().st_size
                except FileNotFoundError:  # compacted in between
                    continue
                if size and size != self.sizes.get(journal.name):
                    self.sizes[journal.name] = size
                    self.spans.setdefault(journal.name, [now, now])[1] = now
            time.sleep(0.02)

    def finish(self, wall: float) -> dict[str, float | None]:
        self.stop.set()
        spans = sorted(self.spans.values())
        if not spans:
            return dict.fromkeys(TIMELINE)
        idle = sum(max(0.0, nxt[0] - prev[1]) for prev, nxt in itertools.pairwise(spans))
        return {
            "first_s": spans[0][0],
            "idle_between_shards_s": idle,
            "after_last_s": wall - max(e for _, e in spans),
        }


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process and the children it has waited for (a
    command arm and what that command waited for), by the reference server, and by the other live
    children (the reused Prefect server)."""
    own, reaped = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    used = dict.fromkeys(CPU_PARTS, 0.0)
    used["client"] = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    for child in psutil.Process().children(recursive=True):
        try:
            times, argv = child.cpu_times(), child.cmdline()
        except psutil.NoSuchProcess:
            continue
        used["server" if "eagle3.serve.reference" in argv else "prefect"] += (
            times.user + times.system
        )
    return used


def timed(run: Callable[[], int], regen_dir: Path | None) -> dict[str, float | None]:
    """tok/s of one arm (completion tokens over wall time), its CPU seconds by process
    (``cpu_seconds``) and, for the pipeline arms, its timeline (``Timeline``)."""
    start, cpu = time.perf_counter(), cpu_seconds()
    timeline = Timeline(regen_dir, start) if regen_dir is not None else None
    tokens = run()
    wall = time.perf_counter() - start
    used = {f"cpu_{name}_s": seconds - cpu[name] for name, seconds in cpu_seconds().items()}
    marks = timeline.finish(wall) if timeline is not None else dict.fromkeys(TIMELINE)
    return {"tok_s": tokens / wall, "wall_s": wall, **marks, **used}


def command_tokens(
    config_path: Path, prompts_dir: Path, regen_dir: Path, env: dict[str, str]
) -> int:
    """Run ``eagle3 regen`` as a user does (a fresh process); its completion tokens from the stage
    manifest."""
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "regen",
        "--config",
        str(config_path),
        "--prompts",
        str(prompts_dir),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    manifest = Manifest.read(regen_dir)
    if done.returncode != 0 or manifest is None:
        raise RuntimeError(f"eagle3 regen exited {done.returncode}: {done.stderr[-2000:]}")
    return int(manifest.stats["completion_tokens"])


def specforge_tokens(
    script: Path, server_url: str, prompts: list[str], new: int, concurrency: int, tok, work: Path
) -> int:
    """Run SpecForge's regen script as its README does (a fresh process); its answers' tokens,
    re-tokenized."""
    work.mkdir(parents=True)
    source, out = work / "in.jsonl", work / "out.jsonl"
    source.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "conversations": [{"role": "user", "content": text}]}) + "\n"
            for i, text in enumerate(prompts)
        )
    )
    cmd = [
        sys.executable,
        str(script),
        "--model",
        "bench",
        "--concurrency",
        str(concurrency),
        "--max-tokens",
        str(new),
        "--temperature",
        "0.0",
        "--server-address",
        server_url.split("://", 1)[-1],
        "--input-file-path",
        str(source),
        "--output-file-path",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if done.returncode != 0 or len(rows) != len(prompts):
        raise RuntimeError(
            f"SpecForge's script exited {done.returncode} with {len(rows)}/{len(prompts)} answers: "
            f"{done.stderr[-2000:]}"
        )
    answers = [row["conversations"][-1]["content"] for row in rows]
    return sum(len(ids) for ids in tok(answers, add_special_tokens=False)["input_ids"])


@contextmanager
def running_prefect(env: dict[str, str], home: Path) -> Iterator[dict[str, str]]:
    """A Prefect API server started once, for the block (the command's own start-up policy, so the
    same app), over its own database under ``home`` (not this user's, nor the temporary servers');
    yields ``env`` with ``PREFECT_API_URL`` naming it. No telemetry, as for the commands
    (``flows.cli``)."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_HOME,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )

    from flows.commands.common import prefect_api

    settings = {
        PREFECT_API_URL: None,
        PREFECT_HOME: str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED: False,
    }
    with temporary_settings(settings), prefect_api():
        yield {**env, "PREFECT_API_URL": str(PREFECT_API_URL.value())}


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    parser = benchmark_parser(__doc__, quick="48 prompts x 16 tokens")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--specforge", type=Path, help="a SpecForge checkout's scripts/ folder: adds its regen arm"
    )
    args = parser.parse_args()
    arms = ARMS + (("specforge",) if args.specforge else ())
    n, new = (48, 16) if args.quick else (args.prompts, args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_target(root / "model")
        prompts_dir = write_prompts(root, n, rows_per_shard=max(n // 4, 1))
        # the library arm starts with the tokenizer loaded; the command arm loads its own
        tok = load_tokenizer(TargetRef(str(model)))
        texts = [f"question {i} about topic {i % 11}, please answer" for i in range(n)]
        ids = [render_prompt(tok, [{"role": "user", "content": text}]) for text in texts]
        env = {
            **os.environ,
            "PREFECT_HOME": str(root / "prefect"),
            "PYTHONPATH": str(Path(__file__).parents[1]),
        }
        env.pop("PREFECT_API_URL", None)
        # The database a user's first command creates (Prefect's migrations: ~10 s of CPU), made
        # before the rounds: every later command finds it, so no round's command arm pays it.
        upgrade = [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"]
        subprocess.run(upgrade, env=env, check=True, capture_output=True)
        extra = ["--max-running-requests", str(args.concurrency), "--num-threads", "1"]
        reused = running_prefect(env, root / "prefect-reused")
        with reference_server(model, extra_args=extra) as server, reused as reused_env:
            params = {
                "max_new_tokens": new,
                "temperature": 0.0,
                "top_p": 1.0,
                "top_k": -1,
                "stop": [],
            }
            asyncio.run(bare_client(server.url, ids[:8], params, args.concurrency))  # warm-up

            def config(run: str) -> PipelineConfig:
                regen = RegenConfig(
                    servers=[server.url],
                    concurrency_per_server=args.concurrency,
                    max_new_tokens=new,
                    temperature=0.0,
                )
                target = TargetConfig(
                    model_path=str(model),
                    num_layers=8,
                    hidden_size=128,
                    vocab_size=1024,
                    context_length=1024,
                )
                return PipelineConfig(
                    name="bench", root=str(root / run), regen=regen, target=target
                )

            def arm(name: str, r: int) -> dict[str, float | None]:
                if name == "bare":
                    return timed(
                        lambda: asyncio.run(bare_client(server.url, ids, params, args.concurrency)),
                        None,
                    )
                if name == "specforge":
                    script = args.specforge / "regenerate_train_data.py"
                    return timed(
                        lambda: specforge_tokens(
                            script,
                            server.url,
                            texts,
                            new,
                            args.concurrency,
                            tok,
                            root / f"specforge-{r}",
                        ),
                        None,
                    )
                cfg = config(f"{name}-{r}")
                regen_dir = regen_dir_for(cfg, prompts_dir)
                if name == "library":
                    return timed(
                        lambda: int(
                            run_stage(RegenStage(), cfg, prompts_dir=prompts_dir).summary[
                                "completion_tokens"
                            ]
                        ),
                        regen_dir,
                    )
                path = root / f"{name}-{r}.yaml"
                path.write_text(cfg.to_yaml())
                arm_env = reused_env if name == "command_reused" else env
                return timed(
                    lambda: command_tokens(path, prompts_dir, regen_dir, arm_env), regen_dir
                )

            rounds = []
            for r in range(args.rounds):
                order = arms[r % len(arms) :] + arms[: r % len(arms)]
                rounds.append({name: arm(name, r) for name in order})
                print(json.dumps({"round": r, "order": order, **rounds[-1]}), flush=True)
            serial = timed(
                lambda: asyncio.run(bare_client(server.url, ids[: max(n // 4, 8)], params, 1)), None
            )
    report_rounds(rounds, arms, n, new, args.concurrency, serial["tok_s"] or 0.0)


def report_rounds(
    rounds: list[dict[str, dict[str, float | None]]],
    arms: tuple[str, ...],
    n: int,
    new: int,
    concurrency: int,
    serial: float,
) -> None:
    bare = [r["bare"]["tok_s"] or 0.0 for r in rounds]
    result = {
        "prompts": n,
        "max_new_tokens": new,
        "concurrency": concurrency,
        "rounds": len(rounds),
        "tok_s": {arm: spread([r[arm]["tok_s"] or 0.0 for r in rounds]) for arm in arms},
        "ratio_to_bare": {
            arm: spread([(r[arm]["tok_s"] or 0.0) / (r["bare"]["tok_s"] or 1.0) for r in rounds])
            for arm in arms[1:]
        },
        **{
            mark: {arm: spread([r[arm][mark] or 0.0 for r in rounds]) for arm in ARMS[1:]}
            for mark in TIMELINE
        },
        "wall_s": {arm: spread([r[arm]["wall_s"] or 0.0 for r in rounds]) for arm in arms},
        "cpu_s": {
            arm: {
                name: spread([r[arm][f"cpu_{name}_s"] or 0.0 for r in rounds]) for name in CPU_PARTS
            }
            for arm in arms
        },
        "server_tok_s_c1": round(serial, 1),
        "batching_gain": round(statistics.median(bare) / serial, 2) if serial else None,
    }
    if "specforge" in arms:
        result["wall_over_specforge"] = {
            arm: spread(
                [(r["specforge"]["wall_s"] or 0.0) / (r[arm]["wall_s"] or 1.0) for r in rounds]
            )
            for arm in ("library", *COMMAND_ARMS)
        }
    print(json.dumps(result, indent=2))
    for arm, goal in (("library", 0.97), ("command", 0.90), ("command_reused", 0.90)):
        ratio = result["ratio_to_bare"][arm]
        print(
            f"regen {arm} / bare client = {ratio['median']:.3f} (range {ratio['min']:.3f}-{ratio['max']:.3f} over "
            f"{len(rounds)} rounds; goal >= {goal})"
        )
    for arm in arms:
        cpu = {name: seconds["median"] for name, seconds in result["cpu_s"][arm].items()}
        print(
            f"{arm}: wall {result['wall_s'][arm]['median']:.1f} s, CPU s (medians) client {cpu['client']:.1f}, "
            f"reference server {cpu['server']:.1f}, reused Prefect server {cpu['prefect']:.1f}"
        )
    for arm in ARMS[1:]:
        marks = {mark: result[mark][arm]["median"] for mark in TIMELINE}
        print(
            f"{arm}: first completion {marks['first_s']:.2f} s, idle between shards "
            f"{marks['idle_between_shards_s']:.2f} s, last completion to exit {marks['after_last_s']:.2f} s "
            "(medians)"
        )
    for arm, ratio in result.get("wall_over_specforge", {}).items():
        print(
            f"SpecForge's script wall / regen {arm} wall = {ratio['median']:.3f} (range {ratio['min']:.3f}-"
            f"{ratio['max']:.3f}; > 1: faster than the peer's command)"
        )


if __name__ == "__main__":
    main()
