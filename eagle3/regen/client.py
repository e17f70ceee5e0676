"""One generation request with retries (docs/DESIGN.md, "Reliability rules"), over SGLang's
``/generate`` or the OpenAI chat API.

* Every attempt carries a fresh rid, ``<base>-a<attempt>`` (``base`` is the sample id and turn; the
  sample id stays the journal key). SGLang refuses a rid that is still in flight (400 ``Duplicate
  request ID detected``, sgl-project/sglang ``python/sglang/srt/managers/tokenizer_manager.py``,
  ``TokenizerManager``): after a client-side timeout the server may still be running the first
  attempt, so resending its rid would turn a slow answer into a lost sample.
* 200: the reply. Retryable, with exponential backoff and full jitter (``backoff_base_s * 2**k``,
  capped at ``backoff_max_s``) up to ``max_retries`` times, possibly on another server, then
  ``RetriesExhausted``: SGLang's transient answers (a duplicate-rid 400, 429, 503 queue full; these
  do not count towards ejection: the server is alive) and signs of a failing server (5xx, 408,
  connection loss, timeouts, unparsable replies; these do count).
* No server: while every server is out of rotation the request waits in the pool without spending an
  attempt; ``NoServerAvailable`` (no server healthy for ``regen.no_server_timeout_s``) is not
  retried: it fails the shard.
* Permanent: any other 4xx, a true input error, raised as ``BadRequestError`` with the server's
  message; the sample fails alone.
* ``/generate`` sends the project's token ids and gets token ids back: nothing is re-tokenized. The
  OpenAI path sends messages (with the conversation's ``tools`` and the template's
  ``chat_template_kwargs``) and gets text, and the ``reasoning_content`` a server's reasoning parser
  split off; its ids are re-tokenized from that text and the row's meta says so. A reply whose calls
  a server-side tool-call parser took out of the text cannot be rebuilt token for token: it is
  refused (retried, then the shard fails with the fix: start the server without one).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from eagle3.config.regen import RegenConfig
from eagle3.regen.pool import ServerPool


class BadRequestError(RuntimeError):
    """The server refused the request (4xx); the message is the server's."""


class RetriesExhausted(RuntimeError):
    """A request failed ``max_retries + 1`` times with retryable errors (server gone or failing)."""


@dataclass
class Reply:
    """One turn as received: output ids and text, the finish reason, and where and how it was
    obtained."""

    output_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    server: str
    latency_s: float
    attempts: int
    # OpenAI path: the reasoning_content a server's reasoning parser split off
    reasoning: str | None = None


def sampling_params(cfg: RegenConfig) -> dict[str, Any]:
    """SGLang ``sampling_params`` from ``config.regen`` (recorded in the manifest)."""
    return {
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "stop": list(cfg.stop),
    }


def backoff_s(cfg: RegenConfig, attempt: int, rng: random.Random) -> float:
    """Full-jitter exponential backoff before retry number ``attempt`` (1-based)."""
    return rng.uniform(0.0, min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** (attempt - 1)))


# SGLang's message for a rid still in flight (TokenizerManager)
DUPLICATE_RID = "Duplicate request ID"


def attempt_rid(base: str, attempt: int) -> str:
    """The rid of one attempt: unique per attempt, so a retry never collides with its own timed-out
    predecessor."""
    return f"{base}-a{attempt}"


def classify(status: int, message: str) -> str:
    """What an HTTP error means for the request: ``transient`` (retry, server healthy), ``failure``
    (retry, counts towards ejection) or ``permanent`` (the input is wrong; no retry)."""
    if status in (429, 503) or (status == 400 and DUPLICATE_RID in message):
        return "transient"
    if status >= 500 or status == 408:
        return "failure"
    return "permanent"


def _error_message(status: int, body: str) -> str:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return f"HTTP {status}: {body[:500]}"
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        err = err.get("message", err)
    return f"HTTP {status}: {err}"


class Client:
    """Sends turns through a ``ServerPool``; one per event loop (it owns an ``aiohttp`` session)."""

    def __init__(
        self,
        cfg: RegenConfig,
        pool: ServerPool,
        *,
        api_key: str | None = None,
        seed: int = 0,
        context_length: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.context_length = context_length
        self.pool = pool
        self.params = sampling_params(cfg)
        self.timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.rng = random.Random(seed)
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        connector = aiohttp.TCPConnector(limit=self.pool.capacity + 8)
        self.session = aiohttp.ClientSession(connector=connector, headers=self.headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()

    async def generate(self, base_rid: str, prompt_ids: list[int]) -> Reply:
        """One ``/generate`` turn; ``base_rid`` names the turn, each attempt's rid is
        ``attempt_rid(base_rid, n)``.

        With a ``context_length``, ``max_new_tokens`` is capped at the room the prompt leaves:
        SGLang refuses a request whose prompt plus ``max_new_tokens`` exceeds the context (400),
        where the answer should just stop at the context (``finish_reason`` length, a truncated
        sample); a prompt that fills the context is refused here (``BadRequestError``) without a
        request."""
        params = self.params
        if self.context_length is not None:
            room = self.context_length - len(prompt_ids)
            if room <= 0:
                raise BadRequestError(
                    f"the prompt has {len(prompt_ids)} tokens, the context length is "
                    f"{self.context_length}: no room to generate a reply"
                )
            params = params | {"max_new_tokens": min(params["max_new_tokens"], room)}
        payload = {"input_ids": prompt_ids, "sampling_params": params}
        return await self._with_retries("/generate", payload, base_rid, _parse_generate)

    async def chat(
        self,
        base_rid: str,
        messages: list[dict[str, Any]],
        model: str,
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> Reply:
        """One OpenAI chat turn; rids as in ``generate``."""
        payload: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": self.cfg.max_new_tokens,
            "temperature": self.cfg.temperature,
            "top_p": self.cfg.top_p,
        }
        if self.cfg.top_k > 0:
            payload["top_k"] = self.cfg.top_k
        if self.cfg.stop:
            payload["stop"] = list(self.cfg.stop)
        if tools:
            payload["tools"] = tools
        if template_kwargs:
            payload["chat_template_kwargs"] = template_kwargs
        return await self._with_retries("/v1/chat/completions", payload, base_rid, _parse_chat)

    async def _with_retries(
        self, path: str, payload: dict[str, Any], base_rid: str, parse: Any
    ) -> Reply:
        assert self.session is not None, "use `async with Client(...)`"
        last = "no attempt made"
        for attempt in range(1, self.cfg.max_retries + 2):
            if attempt > 1:
                await asyncio.sleep(backoff_s(self.cfg, attempt - 1, self.rng))
            # waits out an outage; NoServerAvailable ends the shard
            server = await self.pool.acquire(self.session)
            start = time.monotonic()
            outcome: bool | None = False
            body_json = payload | {"rid": attempt_rid(base_rid, attempt)}
            try:
                async with self.session.post(
                    server.url + path, json=body_json, timeout=self.timeout
                ) as resp:
                    body = await resp.text()
                    if resp.status == 200:
                        fields = parse(json.loads(body))
                        outcome = True
                        return Reply(
                            **fields,
                            server=server.url,
                            latency_s=time.monotonic() - start,
                            attempts=attempt,
                        )
                    last = _error_message(resp.status, body)
                    kind = classify(resp.status, last)
                    if kind != "failure":
                        outcome = None  # the server answered sensibly: no ejection
                    if kind == "permanent":
                        raise BadRequestError(last)
            except asyncio.CancelledError:
                outcome = None  # the shard was stopped: not the server's failure (no ejection)
                raise
            except (
                aiohttp.ClientError,
                asyncio.TimeoutError,
                ValueError,
                KeyError,
                TypeError,
            ) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            finally:
                self.pool.release(server, outcome, error=last)
        raise RetriesExhausted(
            f"{path} failed {self.cfg.max_retries + 1} times; last error: {last}"
        )


def _parse_generate(data: dict[str, Any]) -> dict[str, Any]:
    meta = data["meta_info"]
    return {
        "output_ids": [int(i) for i in data["output_ids"]],
        "text": data["text"],
        "finish_reason": (meta.get("finish_reason") or {}).get("type", "unknown"),
        "prompt_tokens": int(meta.get("prompt_tokens", 0)),
    }


def _parse_chat(data: dict[str, Any]) -> dict[str, Any]:
    choice = data["choices"][0]
    if choice["message"].get("tool_calls"):
        raise ValueError(
            "the server parsed the tool calls out of the reply (--tool-call-parser), so its text cannot "
            "be rebuilt token for token: start it without a tool-call parser"
        )
    return {
        "output_ids": [],  # filled by re-tokenizing the text (see regen.sample)
        "text": choice["message"]["content"] or "",
        "reasoning": choice["message"].get("reasoning_content"),
        "finish_reason": choice.get("finish_reason") or "unknown",
        "prompt_tokens": int((data.get("usage") or {}).get("prompt_tokens", 0)),
    }
