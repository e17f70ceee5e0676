"""Benchmark prompts: load the sets, render them once with the target's chat template, send them,
collect results.

Design choices:
- A prompt set is a local file in any shape ``eagle3.data.prompt_sets`` reads (the project's
  ``{"id", "prompt"}`` rows, MT-bench's ``turns``, HumanEval, ShareGPT-style conversations, plain
  JSONL; gzip or not; a tool-use row may add its ``tools`` and the ``messages`` to continue,
  OpenAI-shaped, e.g. up to a tool result) or ``hub:<dataset>`` read through
  ``datasets.load_dataset`` (optional query ``?config=..&split=..&column=..``; without ``column``
  the first of ``prompt, question, instruction, problem, input, turns, text`` present is used, a
  list taking its first item). A local directory after ``hub:`` goes through the same code path,
  which is how it is tested offline.
- Prompts are rendered with ``eagle3.data.template.render_prompt`` (one user turn, or the row's
  messages, with its tools, + generation prompt) and sent as ``input_ids``, so both arms see
  identical tokens and no server-side template can differ between them.
- Requests sample as the caller says (the gate: its ``gate.sampling`` profile, greedy by default)
  and respect EOS (``ignore_eos`` false): the served output length is what a user would get. Every
  request is sent once; a failed request is recorded with the server's message and the caller
  decides (the gate refuses an arm with failures rather than averaging over a partial run).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp

from eagle3.data.prompt_sets import read_prompt_set
from eagle3.data.template import ChatOptions, render_prompt
from eagle3.gate.accept import SpecCounts

logger = logging.getLogger(__name__)

HUB_PREFIX = "hub:"
PROMPT_COLUMNS: tuple[str, ...] = (
    "prompt",
    "question",
    "instruction",
    "problem",
    "input",
    "turns",
    "text",
)


@dataclass(frozen=True)
class BenchPrompt:
    set_name: str
    prompt_id: str
    prompt: str
    input_ids: tuple[int, ...] = ()
    # the conversation to continue; empty: one user turn, ``prompt``
    messages: tuple[dict[str, Any], ...] = ()
    tools: tuple[dict[str, Any], ...] = ()


@dataclass
class RequestResult:
    prompt_id: str
    completion_tokens: int = 0
    prompt_tokens: int = 0
    spec: SpecCounts = field(default_factory=SpecCounts)
    latency_s: float = 0.0
    finish_reason: str | None = None
    error: str | None = None
    output_ids: tuple[int, ...] = ()

    @property
    def spec_verify_ct(self) -> int:
        return self.spec.verify_ct


@dataclass
class Sent:
    """Results in input order and the wall time from the first send to the last answer."""

    results: list[RequestResult] = field(default_factory=list)
    duration_s: float = 0.0


def _prompt_text(row: dict[str, Any], column: str | None, source: str) -> str:
    names = [column] if column else [c for c in PROMPT_COLUMNS if c in row]
    if not names or names[0] not in row:
        raise ValueError(
            f"{source}: no prompt column (looked for {column or list(PROMPT_COLUMNS)}); "
            "add ?column=<name> to the source"
        )
    value = row[names[0]]
    if isinstance(value, list):
        value = value[0] if value else ""
    return str(value)


def _load_local(path: Path, set_name: str) -> list[BenchPrompt]:
    rows = read_prompt_set(path, set_name)
    return [BenchPrompt(set_name, r.prompt_id, r.prompt, (), r.messages, r.tools) for r in rows]


def _load_hub(spec: str, set_name: str) -> list[BenchPrompt]:
    import datasets

    name, _, query = spec.partition("?")
    opts = {k: v[-1] for k, v in parse_qs(query).items()}
    loaded = datasets.load_dataset(name, opts.get("config"), split=opts.get("split"))
    if isinstance(loaded, datasets.DatasetDict):
        split = "test" if "test" in loaded else next(iter(loaded))
        loaded = loaded[split]
    out = []
    for n, row in enumerate(loaded):
        pid = str(row.get("id", row.get("question_id", row.get("task_id", f"{set_name}-{n}"))))
        out.append(BenchPrompt(set_name, pid, _prompt_text(row, opts.get("column"), spec)))
    return out


def load_prompt_set(set_name: str, source: str, *, limit: int | None = None) -> list[BenchPrompt]:
    """The first ``limit`` prompts of one set from a local file (``eagle3.data.prompt_sets``) or
    ``hub:<id>[?config=&split=&column=]``."""
    if source.startswith(HUB_PREFIX):
        prompts = _load_hub(source[len(HUB_PREFIX) :], set_name)
    else:
        prompts = _load_local(Path(source).expanduser(), set_name)
    if not prompts:
        raise ValueError(f"prompt set {set_name!r} ({source}) is empty")
    return prompts[:limit] if limit else prompts


def render_prompts(tokenizer: Any, prompts: list[BenchPrompt]) -> list[BenchPrompt]:
    """The same prompts with ``input_ids`` from the project's one renderer (messages + generation
    prompt)."""
    out = []
    for p in prompts:
        messages = list(p.messages) or [{"role": "user", "content": p.prompt}]
        ids = render_prompt(tokenizer, messages, ChatOptions(tools=list(p.tools) or None))
        out.append(BenchPrompt(p.set_name, p.prompt_id, p.prompt, tuple(ids), p.messages, p.tools))
    return out


def load_gate_prompts(
    prompt_sets: dict[str, str], tokenizer: Any, *, per_set: int
) -> list[BenchPrompt]:
    """Every configured set, ``per_set`` prompts each, rendered; sets in sorted order for a stable
    prompt list."""
    if not prompt_sets:
        raise ValueError(
            "gate.prompt_sets is empty: set e.g. gate.prompt_sets.chat=path/to/chat.jsonl"
        )
    prompts: list[BenchPrompt] = []
    for name in sorted(prompt_sets):
        prompts += load_prompt_set(name, prompt_sets[name], limit=per_set)
    return render_prompts(tokenizer, prompts)


GREEDY: dict[str, Any] = {"temperature": 0.0}


async def _send_one(
    session: aiohttp.ClientSession,
    url: str,
    prompt_id: str,
    ids: list[int],
    max_new_tokens: int,
    sampling: dict[str, Any],
) -> RequestResult:
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, **sampling, "ignore_eos": False},
    }
    start = time.perf_counter()
    try:
        async with session.post(f"{url}/generate", json=body) as resp:
            text = await resp.text()
            if resp.status != 200:
                return RequestResult(prompt_id, error=f"HTTP {resp.status}: {text[:200]}")
            answer = json.loads(text)
            meta = answer.get("meta_info", {})
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
        return RequestResult(prompt_id, error=f"{type(exc).__name__}: {exc}")
    finish = meta.get("finish_reason")
    return RequestResult(
        prompt_id,
        completion_tokens=int(meta.get("completion_tokens", 0)),
        prompt_tokens=int(meta.get("prompt_tokens", len(ids))),
        spec=SpecCounts.of(meta),
        latency_s=time.perf_counter() - start,
        finish_reason=finish.get("type") if isinstance(finish, dict) else finish,
        output_ids=tuple(answer.get("output_ids") or ()),
    )


async def send_prompts_async(
    url: str,
    prompts: list[tuple[str, list[int]]],
    *,
    concurrency: int,
    max_new_tokens: int,
    sampling: Sequence[dict[str, Any]] | None = None,
    timeout_s: float = 600.0,
) -> Sent:
    """Send ``(prompt_id, input_ids)`` pairs with at most ``concurrency`` in flight; ``sampling``
    gives each its ``sampling_params`` fields (temperature, top_p, top_k, sampling_seed; default
    greedy)."""
    url = url.rstrip("/")
    per_prompt = list(sampling) if sampling is not None else [GREEDY] * len(prompts)
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def bounded(pid: str, ids: list[int], params: dict[str, Any]) -> RequestResult:
            async with gate:
                return await _send_one(session, url, pid, ids, max_new_tokens, params)

        start = time.perf_counter()
        sends = (
            bounded(pid, list(ids), params)
            for (pid, ids), params in zip(prompts, per_prompt, strict=True)
        )
        results = await asyncio.gather(*sends)
        return Sent(list(results), time.perf_counter() - start)


def send_prompts(
    url: str,
    prompts: list[tuple[str, list[int]]] | list[list[int]],
    *,
    concurrency: int,
    max_new_tokens: int,
    sampling: Sequence[dict[str, Any]] | None = None,
    timeout_s: float = 600.0,
) -> list[RequestResult]:
    """Blocking form of ``send_prompts_async``; bare id lists get ids ``p0, p1, ...``."""
    pairs = [p if isinstance(p, tuple) else (f"p{i}", p) for i, p in enumerate(prompts)]
    sent = asyncio.run(
        send_prompts_async(
            url,
            pairs,
            concurrency=concurrency,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            timeout_s=timeout_s,
        )
    )
    return sent.results
