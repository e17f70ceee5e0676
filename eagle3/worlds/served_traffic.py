"""Served traffic for the tiny world: the request logs a team serving the tiny target would have.

The tiny target is served by the reference server with SGLang's request logging on (``--log-requests
--log-requests-level 3 --log-requests-format json``, ``eagle3.serve.reference.request_log``), and
users' traffic is sent to it: conversations of the tiny world's kinds drawn from a seed of their own
(so they are not the sample datasets' prompts), mostly chat requests (``/v1/chat/completions``,
multi-turn ones with their history), some ``/generate`` requests a client rendered itself, in phases
of different concurrency so the logs have a load profile. It also holds what real logs hold that is
not data: the server's health probes, raw-text completions (no chat template), and answers cut at a
small ``max_new_tokens``. The logs (``logs/``, with the ``server_info.json`` the launcher writes)
are what the ``tiny_served`` recipe's served source reads.

A pure function of ``ServedTrafficSpec`` and the tiny world it serves (greedy answers; arrival times
are real but only the load profile reads them), built once under ``<cache>/served-traffic-<fp>``
with ``world.json`` written last, like the tiny world. With ``draft`` set (an exported draft
directory), the server speculates with it, so the logs carry each request's ``spec_accept_length``
(the aimed policy by served acceptance reads it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle3.worlds.conversations import Conversation, ConversationFactory
from eagle3.worlds.world import WORLD_FILE, TinyWorld, TinyWorldSpec, build_cached, build_tiny_world

TRAFFIC_VERSION = "1"
LOG_DIR = "logs"


@dataclass(frozen=True)
class ServedTrafficSpec:
    """What the traffic depends on (with the tiny world it is sent to)."""

    DIR_PREFIX = "served-traffic"
    requests: int = 160
    seed: int = 101
    phases: tuple[int, ...] = (2, 8, 4)  # concurrency of each consecutive phase
    max_new_tokens: int = 96
    generate_share: float = 0.25  # requests a client rendered itself and sent to /generate
    short_every: int = 20  # every Nth request asks for 4 tokens (cut at max_new_tokens)
    raw_text: int = 3  # completions of raw text, no chat template
    health_every: int = 30  # a health probe after every Nth request
    draft: str | None = None  # an exported draft: the server speculates (EAGLE3, 3 steps)

    def fingerprint(self, world: TinyWorldSpec) -> str:
        payload = {"version": TRAFFIC_VERSION, "world": world.fingerprint(), **asdict(self)}
        if self.draft:
            payload["draft"] = _dir_digest(Path(self.draft))
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ServedTraffic:
    """A built traffic directory: ``log_dir`` holds the request logs; ``model_dir`` is the target
    that served."""

    root: Path
    log_dir: Path
    model_dir: Path
    report: dict[str, Any]


def _dir_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()[:16]


def traffic_dir_for(
    cache_dir: Path, spec: ServedTrafficSpec, world: TinyWorldSpec | None = None
) -> Path:
    """Where the traffic of ``spec`` lives (or will), without building it."""
    return Path(cache_dir) / f"{spec.DIR_PREFIX}-{spec.fingerprint(world or TinyWorldSpec())}"


def _requests(spec: ServedTrafficSpec, world: TinyWorld) -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of every request, in sending order."""
    from eagle3.target_io import TargetRef, load_tokenizer

    tokenizer = load_tokenizer(TargetRef(str(world.model_dir)))
    factory, rng = ConversationFactory(spec.seed), random.Random(spec.seed)
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(spec.requests):
        kind, conv = factory.make()
        prompt: Conversation = conv[: max(j for j, m in enumerate(conv) if m["role"] == "user") + 1]
        budget = (
            4
            if spec.short_every and i % spec.short_every == spec.short_every - 1
            else spec.max_new_tokens
        )
        headers = {"x-smg-routing-key": kind}
        if rng.random() < spec.generate_share:
            text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            body = {
                "input_ids": ids,
                "sampling_params": {"max_new_tokens": budget, "temperature": 0},
            }
            out.append(("/generate", {"body": body, "headers": headers}))
        else:
            body = {"model": "tiny", "messages": prompt, "max_tokens": budget, "temperature": 0}
            out.append(("/v1/chat/completions", {"body": body, "headers": headers}))
        if spec.health_every and i % spec.health_every == spec.health_every - 1:
            out.append(("/health_generate", {}))
    for k in range(spec.raw_text):
        body = {
            "text": f"Once upon a time, story {k}",
            "sampling_params": {"max_new_tokens": 16, "temperature": 0},
        }
        out.insert(
            len(out) * (k + 1) // (spec.raw_text + 1), ("/generate", {"body": body, "headers": {}})
        )
    return out


async def send_requests(
    url: str,
    requests: list[tuple[str, dict[str, Any]]],
    phases: tuple[int, ...],
    *,
    timeout_s: float = 600.0,
) -> dict[str, int]:
    """Send ``requests`` (``(path, {"body", "headers"})``; ``/health_generate`` is a GET) in
    consecutive phases, each at its concurrency; counts by HTTP status."""
    import aiohttp

    statuses: dict[str, int] = {}
    per_phase = -(-len(requests) // len(phases))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:

        async def one(path: str, item: dict[str, Any], slots: asyncio.Semaphore) -> None:
            async with slots:
                if path == "/health_generate":
                    response = await session.get(url + path)
                else:
                    response = await session.post(
                        url + path, json=item["body"], headers=item["headers"]
                    )
                async with response:
                    await response.read()
                    statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1

        for k, level in enumerate(phases):
            slots = asyncio.Semaphore(level)
            batch = requests[k * per_phase : (k + 1) * per_phase]
            await asyncio.gather(*(one(path, item, slots) for path, item in batch))
    return statuses


def _build_into(
    root: Path, spec: ServedTrafficSpec, world: TinyWorld, say: Callable[[str], None]
) -> ServedTraffic:
    from eagle3.config.gate import SpeculativeConfig
    from eagle3.data.served_log import log_flags
    from eagle3.serve.launch import reference_server
    from eagle3.serve.launch_commands import speculative_args

    start = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    log_dir = root / LOG_DIR
    args = [
        "--max-running-requests",
        str(max(spec.phases)),
        "--dtype",
        "float32",
        "--num-threads",
        "1",
        *log_flags(log_dir),
    ]
    if spec.draft:
        args += speculative_args(SpeculativeConfig(num_steps=3, num_draft_tokens=4), spec.draft)
    requests = _requests(spec, world)
    say(f"serving {len(requests)} requests at concurrency {list(spec.phases)}")
    with reference_server(world.model_dir, extra_args=args, log_path=root / "server.log") as server:
        statuses = asyncio.run(send_requests(server.url, requests, spec.phases))
    report = {
        "requests": len(requests),
        "statuses": statuses,
        "seconds": round(time.monotonic() - start, 1),
    }
    (root / WORLD_FILE).write_text(
        json.dumps({"spec": asdict(spec), "report": report}, indent=1) + "\n"
    )
    return ServedTraffic(root, log_dir, world.model_dir, report)


def build_served_traffic(
    cache_dir: Path,
    spec: ServedTrafficSpec | None = None,
    *,
    world_spec: TinyWorldSpec | None = None,
    progress: Callable[[str], None] | None = None,
    num_threads: int | None = None,
) -> tuple[ServedTraffic, bool]:
    """The traffic of ``spec`` sent to the tiny world of ``world_spec`` (both built once and cached
    under ``cache_dir``), and whether the traffic was a cache hit."""
    spec, world_spec = spec or ServedTrafficSpec(), world_spec or TinyWorldSpec()
    world, _hit = build_tiny_world(
        cache_dir, world_spec, progress=progress, num_threads=num_threads
    )

    def say(message: str) -> None:
        if progress is not None:
            progress(message)

    final = traffic_dir_for(cache_dir, spec, world_spec)
    built = build_cached(final, lambda tmp: _build_into(tmp, spec, world, say), say=say)
    report = json.loads((final / WORLD_FILE).read_text())["report"]
    return ServedTraffic(final, final / LOG_DIR, world.model_dir, report), built is None
