"""The HTTP layer: SGLang's endpoint subset (docs/DESIGN.md, "HTTP") on aiohttp.web, as strict as
SGLang 0.5.23 where a client can tell the difference.

Shapes follow SGLang: ``/generate`` returns ``{text, output_ids, meta_info}``; errors are
``{"error": {"message"}}`` (a sampling parameter that does not decode: ``{"error": "<message>"}``,
as SGLang's decoder answers) with status 400 (bad input, or a rid still in flight), 500 (injected or
engine failure) or 503 (queue full, only with ``--max-queued-requests``). Request checks and their
messages are SGLang's (``eagle3.serve.reference.requests``); the conformance test
(``tests/unit/serve/test_sglang_conformance.py``) holds both servers to the same answers, and
docs/ARCHITECTURE.md ("The engines") lists where they still differ and why it does not matter.
Streaming uses server-sent events, one ``data: {...}`` per step with the cumulative text and output
ids, then ``data: [DONE]``.

What mirrors SGLang's source (sgl-project/sglang, python/sglang/srt/):
* A rid that is still in flight is refused with 400 and ``Duplicate request ID detected: <rid>``
  (``managers/tokenizer_manager.py``, ``TokenizerManager`` registering the request state; the
  ``ValueError`` becomes a 400 in ``entrypoints/http_server.py`` ``generate_request`` via
  ``_create_error_response``). A client that resends a timed-out request under the same rid meets
  exactly this answer (``eagle3.regen.client``).
* ``/server_info`` and ``/model_info`` are the canonical info routes; ``/get_server_info`` and
  ``/get_model_info`` are SGLang's deprecated aliases with the same payloads
  (``entrypoints/http_server.py``), served because external tools still call them. Project code
  calls the canonical routes only.
* ``/flush_cache`` answers 400 while requests are running or waiting and 200 when idle
  (``http_server.flush_cache``).
* ``meta_info`` carries the speculative counters (``spec_verify_ct``, ``spec_accept_length``,
  ``spec_accept_rate``, ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``,
  ``spec_correct_drafts_histogram``) only on a speculative server, only on the final chunk, and only
  when the request had verify passes (``TokenizerManager`` adds them from the batch output).
* With ``--reasoning-parser``, a chat reply's thinking is split off into
  ``message.reasoning_content`` (SGLang's ``ReasoningParser.parse_non_stream`` in
  ``entrypoints/openai/serving_chat.py``, ``separate_reasoning`` on by default): forced on for a
  template whose switch is on, so ``reasoning</think>answer`` splits at ``</think>``.
* ``cached_tokens`` counts the prompt tokens the plain engine's prefix cache served
  (``prefix_cache``: whole finished sequences, not SGLang's radix tree; 0 on a speculative server,
  which has none); ``/flush_cache`` empties it, as SGLang's empties its radix cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from eagle3.data.dialect import reasoning_format
from eagle3.serve.reference.args import server_info
from eagle3.serve.reference.faults import FaultInjector
from eagle3.serve.reference.protocol import DEFAULT_NUM_STEPS, Completion, SamplingParams
from eagle3.serve.reference.request_log import RequestLog
from eagle3.serve.reference.requests import BadRequest, GenerateRequest, parse_chat, parse_generate

logger = logging.getLogger(__name__)

GENERATOR = web.AppKey("generator", object)
ARGS = web.AppKey("args", argparse.Namespace)
FAULTS = web.AppKey("faults", FaultInjector)
IN_FLIGHT = web.AppKey("in_flight", set)
REQUEST_LOG = web.AppKey("request_log", object)  # a RequestLog with --log-requests, else None
BODY = "eagle3.body"  # the request's JSON body, kept on the aiohttp request for the request log
CHAT_PATH = "/v1/chat/completions"


def error_response(status: int, message: str, *, plain: bool = False) -> web.Response:
    return web.json_response({"error": message if plain else {"message": message}}, status=status)


def meta_info(c: Completion, prompt_tokens: int, *, drafts_per_pass: int | None) -> dict[str, Any]:
    """The final ``meta_info`` with SGLang 0.5.23's keys; speculative counters only where SGLang
    reports them (see the module docstring). One weight version, no retractions, no reasoning
    parser, no data parallelism."""
    n = len(c.output_ids)
    meta: dict[str, Any] = {
        "id": c.rid,
        "finish_reason": c.finish_reason,
        "prompt_tokens": prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": n,
        "cached_tokens": c.cached_tokens,
        "weight_versions": [{"version": "default", "start": 0, "end": n}],
        "cached_tokens_details": None,
        "dp_rank": None,
        "e2e_latency": c.e2e_latency,
        "response_sent_to_client_ts": time.time(),
    }
    # as SGLang's TokenizerManager._calculate_spec_decoding_metrics
    if drafts_per_pass and c.verify_ct > 0:
        proposed, correct = c.verify_ct * drafts_per_pass, sum(c.accepted_drafts)
        histogram = [0] * (drafts_per_pass + 1)
        for accepted in c.accepted_drafts:
            histogram[accepted] += 1
        meta |= {
            "spec_accept_rate": correct / proposed,
            "spec_accept_length": n / c.verify_ct,
            "spec_num_correct_drafts": correct,
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": c.verify_ct,
            "spec_correct_drafts_histogram": histogram,
        }
    return meta


def _drafts_per_pass(request: web.Request) -> int | None:
    """Draft tokens a verify pass checks on a speculative server (its chain of ``num_steps``), else
    None."""
    args = request.app[ARGS]
    return (args.speculative_num_steps or DEFAULT_NUM_STEPS) if args.speculative_algorithm else None


def _register(request: web.Request, rid: str) -> None:
    """Mark ``rid`` in flight, or refuse it as SGLang's ``TokenizerManager`` does when it already
    is."""
    in_flight = request.app[IN_FLIGHT]
    if rid in in_flight:
        raise BadRequest(f"Duplicate request ID detected: {rid}")
    in_flight.add(rid)


def _text(generator: Any, c: Completion) -> str:
    text = generator.decode(c.output_ids)
    matched = c.finish_reason.get("matched")
    if isinstance(matched, str) and matched and matched in text:
        text = text[: text.rindex(matched)]  # SGLang drops the matched stop string from the text
    return text


async def _admission(request: web.Request) -> web.Response | None:
    """Faults and the queue cap, checked before a request is queued."""
    fault = await request.app[FAULTS].before()
    if fault is not None:
        return error_response(fault.status, fault.message)
    cap = request.app[ARGS].max_queued_requests
    if cap is not None and request.app[GENERATOR].num_waiting >= cap:
        return error_response(503, f"queue full ({cap} waiting requests); retry later")
    return None


def _completed(request: web.Request, req: GenerateRequest, c: Completion) -> None:
    """An answer sent: the rid file (``--request-log``), SGLang's request log
    (``--log-requests``), the faults."""
    path = request.app[ARGS].request_log
    if path:
        with open(path, "a") as fh:
            fh.write(req.rid + "\n")
    _log_finished(request, req, c, request[BODY], chat=request.path == CHAT_PATH)
    request.app[FAULTS].after_completion()


def _log_finished(
    request: web.Request, req: GenerateRequest, c: Completion, body: Any, *, chat: bool
) -> None:
    """``request.finished`` in SGLang's request log, ``out`` as its tokenizer manager has it (not
    the chat reply)."""
    log, generator = request.app[REQUEST_LOG], request.app[GENERATOR]
    if log is not None:
        meta = meta_info(c, len(req.input_ids), drafts_per_pass=_drafts_per_pass(request))
        out = {"text": _text(generator, c), "output_ids": c.output_ids, "meta_info": meta}
        tokenizer = getattr(generator, "tokenizer", None)
        log.finished(body, req, out, request.headers, chat=chat, tokenizer=tokenizer)


async def _read_json(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None


async def _in_flight(
    request: web.Request,
    parse: Callable[[Any, Any], GenerateRequest],
    handle: Callable[[web.Request, GenerateRequest], Awaitable[web.StreamResponse]],
) -> web.StreamResponse:
    """Parse the body, register its rid for the length of ``handle`` (a rid already in flight is
    SGLang's 400)."""
    try:
        request[BODY] = await _read_json(request)
        req = parse(request[BODY], request.app[GENERATOR])
        _register(request, req.rid)
    except BadRequest as exc:
        return error_response(400, str(exc), plain=exc.plain)
    if request.app[REQUEST_LOG] is not None:
        chat = request.path == CHAT_PATH
        request.app[REQUEST_LOG].received(request[BODY], req, request.headers, chat=chat)
    try:
        return await handle(request, req)
    finally:
        request.app[IN_FLIGHT].discard(req.rid)


async def generate(request: web.Request) -> web.StreamResponse:
    return await _in_flight(request, parse_generate, _generate)


async def _reply(
    request: web.Request,
    req: GenerateRequest,
    body: Callable[[Completion], dict[str, Any]],
    *,
    stream: Callable[[web.Request, GenerateRequest], Awaitable[web.StreamResponse]] | None = None,
) -> web.StreamResponse:
    """A request whose rid is registered: admission, then ``stream`` (an SSE reply) or the whole
    generation as one JSON reply, ``body(completion)``; a completed request is logged
    (``--request-log``)."""
    refused = await _admission(request)
    if refused is not None:
        return refused
    if stream is not None:
        return await stream(request, req)
    try:
        c = await request.app[GENERATOR].generate(req.rid, req.input_ids, req.params)
    except RuntimeError as exc:
        return error_response(500, f"generation failed: {exc}")
    response = web.json_response(body(c))
    await response.prepare(request)
    await response.write_eof()
    _completed(request, req, c)
    return response


async def _generate(request: web.Request, req: GenerateRequest) -> web.StreamResponse:
    """``/generate`` once its rid is registered: a JSON reply or an SSE stream."""
    generator = request.app[GENERATOR]

    def body(c: Completion) -> dict[str, Any]:
        meta = meta_info(c, len(req.input_ids), drafts_per_pass=_drafts_per_pass(request))
        return {"text": _text(generator, c), "output_ids": c.output_ids, "meta_info": meta}

    return await _reply(request, req, body, stream=_generate_stream if req.stream else None)


async def _generate_stream(request: web.Request, req: GenerateRequest) -> web.StreamResponse:
    """SSE: one event per engine step with the cumulative output, the final one with
    ``finish_reason``."""
    generator = request.app[GENERATOR]
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    steps: asyncio.Queue[list[int]] = asyncio.Queue()
    task = asyncio.ensure_future(
        generator.generate(req.rid, req.input_ids, req.params, on_tokens=steps.put_nowait)
    )
    start = time.monotonic()
    try:
        while not task.done():
            getter = asyncio.ensure_future(steps.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                break
            ids = getter.result()
            meta = {
                "id": req.rid,
                "finish_reason": None,
                "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(ids),
                "cached_tokens": 0,
                "e2e_latency": time.monotonic() - start,
            }
            await _sse(
                response, {"text": generator.decode(ids), "output_ids": ids, "meta_info": meta}
            )
        c = task.result()
    except RuntimeError as exc:
        await _sse(response, {"error": {"message": f"generation failed: {exc}", "code": 500}})
        await response.write_eof()
        return response
    finally:
        task.cancel()
    meta = meta_info(c, len(req.input_ids), drafts_per_pass=_drafts_per_pass(request))
    await _sse(
        response, {"text": _text(generator, c), "output_ids": c.output_ids, "meta_info": meta}
    )
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    _completed(request, req, c)
    return response


async def _sse(response: web.StreamResponse, obj: Any) -> None:
    await response.write(b"data: " + json.dumps(obj).encode() + b"\n\n")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _in_flight(request, parse_chat, _chat_completions)


async def _chat_completions(request: web.Request, req: GenerateRequest) -> web.StreamResponse:
    """``/v1/chat/completions`` once its rid is registered."""
    return await _reply(request, req, lambda c: _chat_body(request, req, c))


def _chat_body(request: web.Request, req: GenerateRequest, c: Completion) -> dict[str, Any]:
    return {
        "id": req.rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.app[ARGS].model_path or "synthetic",
        "choices": [
            {
                "index": 0,
                "message": _chat_message(request.app[ARGS], req, _text(request.app[GENERATOR], c)),
                "finish_reason": c.finish_reason["type"],
                "matched_stop": c.finish_reason.get("matched"),
            }
        ],
        "usage": {
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(c.output_ids),
            "total_tokens": len(req.input_ids) + len(c.output_ids),
        },
    }


def _chat_message(args: argparse.Namespace, req: GenerateRequest, text: str) -> dict[str, Any]:
    """The reply message; with ``--reasoning-parser``, the thinking apart in ``reasoning_content``
    (None when there is none) as SGLang's ``serving_chat`` returns it, its parser forced on unless
    the request turned the template's thinking switch off."""
    if not args.reasoning_parser or not req.separate_reasoning:
        return {"role": "assistant", "content": text}
    dialect = reasoning_format(args.reasoning_parser)
    reasoning, content = dialect.split(text, forced=dialect.is_on(req.chat_template_kwargs))
    return {"role": "assistant", "content": content, "reasoning_content": reasoning or None}


async def health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def health_generate(request: web.Request) -> web.Response:
    generator = request.app[GENERATOR]
    # SGLang's probe: its rid prefix, one token, greedy; logged as SGLang logs it (readers of served
    # traffic drop it by its rid)
    probe = {"max_new_tokens": 1, "temperature": 0.0}
    req = GenerateRequest(f"HEALTH_CHECK_{uuid.uuid4().hex}", [0], SamplingParams(**probe), False)
    body = {"input_ids": req.input_ids, "sampling_params": probe}
    if request.app[REQUEST_LOG] is not None:
        request.app[REQUEST_LOG].received(body, req, request.headers, chat=False)
    c = await generator.generate(req.rid, req.input_ids, req.params)
    _log_finished(request, req, c, body, chat=False)
    return web.Response(text="")


async def model_info(request: web.Request) -> web.Response:
    generator = request.app[GENERATOR]
    args = request.app[ARGS]
    info = {
        "model_path": args.model_path or "synthetic",
        "tokenizer_path": args.tokenizer_path or args.model_path,
        "is_generation": True,
        "architectures": generator.architectures,
        "synthetic": generator.synthetic,
        "server": "eagle3-reference",
    }
    if generator.synthetic:
        info["note"] = (
            "synthetic load mode for the client-scaling benchmark: no model, outputs are meaningless"
        )
    return web.json_response(info)


async def server_info_route(request: web.Request) -> web.Response:
    generator = request.app[GENERATOR]
    info = server_info(request.app[ARGS])
    info["context_length"] = generator.context_length
    info["internal_states"] = [generator.counters()]
    info["version"] = "eagle3-reference"
    return web.json_response(info)


async def flush_cache(request: web.Request) -> web.Response:
    """200 when idle, 400 while requests run or wait: SGLang refuses to flush under load, so callers
    must retry."""
    if request.app[IN_FLIGHT]:  # every /generate and chat request, queued or running
        return web.Response(status=400, text="Flush cache failed.\n")
    request.app[GENERATOR].flush()
    return web.Response(
        text="Cache flushed.\nPlease check backend logs for more details. (When there are running or "
        "waiting requests, the operation will not be performed.)\n"
    )


def build_app(args: argparse.Namespace, generator: Any) -> web.Application:
    app = web.Application(client_max_size=64 * 2**20)
    app[ARGS] = args
    app[GENERATOR] = generator
    app[FAULTS] = FaultInjector(args)
    app[IN_FLIGHT] = set()
    app[REQUEST_LOG] = RequestLog.from_args(args)
    app.router.add_post("/generate", generate)
    app.router.add_post(CHAT_PATH, chat_completions)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    for path in ("/model_info", "/get_model_info"):  # canonical, then SGLang's deprecated alias
        app.router.add_get(path, model_info)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, server_info_route)
    app.router.add_post("/flush_cache", flush_cache)
    app.router.add_get("/flush_cache", flush_cache)

    async def _close(app: web.Application) -> None:
        app[GENERATOR].close()

    app.on_cleanup.append(_close)
    return app
