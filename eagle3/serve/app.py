"""The HTTP layer: SGLang's endpoint subset (DESIGN §5) on aiohttp.web.

Shapes follow SGLang: ``/generate`` returns ``{text, output_ids, meta_info}``; errors are
``{"error": {"message", "type", "code"}}`` with status 400 (bad input), 500 (injected or engine failure) or 503
(queue full, only with ``--max-queued-requests``). Streaming uses server-sent events, one ``data: {...}`` per step
with the cumulative text and output ids, then ``data: [DONE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
import uuid
from typing import Any

from aiohttp import web

from eagle3.serve.args import server_info
from eagle3.serve.faults import FaultInjector
from eagle3.serve.protocol import Completion
from eagle3.serve.requests import BadRequest, parse_chat, parse_generate

logger = logging.getLogger(__name__)

BACKEND = web.AppKey("backend", object)
ARGS = web.AppKey("args", argparse.Namespace)
FAULTS = web.AppKey("faults", FaultInjector)


def error_response(status: int, message: str) -> web.Response:
    kind = {400: "BadRequestError", 503: "ServiceUnavailableError"}.get(status, "InternalServerError")
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def meta_info(c: Completion, prompt_tokens: int) -> dict[str, Any]:
    return {
        "id": c.rid,
        "finish_reason": c.finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(c.output_ids),
        "cached_tokens": 0,
        "e2e_latency": c.e2e_latency,
        "spec_verify_ct": c.verify_ct,
    }


def _text(backend: Any, c: Completion) -> str:
    text = backend.decode(c.output_ids)
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
    if cap is not None and request.app[BACKEND].num_waiting >= cap:
        return error_response(503, f"queue full ({cap} waiting requests); retry later")
    return None


def _completed(request: web.Request, rid: str) -> None:
    path = request.app[ARGS].request_log
    if path:
        with open(path, "a") as fh:
            fh.write(rid + "\n")
    request.app[FAULTS].after_completion()


async def _read_json(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None


async def generate(request: web.Request) -> web.StreamResponse:
    backend = request.app[BACKEND]
    try:
        req = parse_generate(await _read_json(request), backend)
    except BadRequest as exc:
        return error_response(400, str(exc))
    refused = await _admission(request)
    if refused is not None:
        return refused
    if req.stream:
        return await _generate_stream(request, req)
    try:
        c = await backend.generate(req.rid, req.input_ids, req.params)
    except RuntimeError as exc:
        return error_response(500, f"generation failed: {exc}")
    body = {"text": _text(backend, c), "output_ids": c.output_ids, "meta_info": meta_info(c, len(req.input_ids))}
    response = web.json_response(body)
    await response.prepare(request)
    await response.write_eof()
    _completed(request, req.rid)
    return response


async def _generate_stream(request: web.Request, req: Any) -> web.StreamResponse:
    """SSE: one event per engine step with the cumulative output, the final one with ``finish_reason``."""
    backend = request.app[BACKEND]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    steps: asyncio.Queue[list[int]] = asyncio.Queue()
    task = asyncio.ensure_future(backend.generate(req.rid, req.input_ids, req.params, on_tokens=steps.put_nowait))
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
                "e2e_latency": time.monotonic() - start,
            }
            await _sse(response, {"text": backend.decode(ids), "output_ids": ids, "meta_info": meta})
        c = task.result()
    except RuntimeError as exc:
        await _sse(response, {"error": {"message": f"generation failed: {exc}", "code": 500}})
        await response.write_eof()
        return response
    finally:
        task.cancel()
    meta = meta_info(c, len(req.input_ids))
    await _sse(response, {"text": _text(backend, c), "output_ids": c.output_ids, "meta_info": meta})
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    _completed(request, req.rid)
    return response


async def _sse(response: web.StreamResponse, obj: Any) -> None:
    await response.write(b"data: " + json.dumps(obj).encode() + b"\n\n")


async def chat_completions(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    try:
        req = parse_chat(await _read_json(request), backend)
    except BadRequest as exc:
        return error_response(400, str(exc))
    refused = await _admission(request)
    if refused is not None:
        return refused
    try:
        c = await backend.generate(req.rid, req.input_ids, req.params)
    except RuntimeError as exc:
        return error_response(500, f"generation failed: {exc}")
    body = {
        "id": req.rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.app[ARGS].model_path or "synthetic",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": _text(backend, c)},
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
    response = web.json_response(body)
    await response.prepare(request)
    await response.write_eof()
    _completed(request, req.rid)
    return response


async def health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def health_generate(request: web.Request) -> web.Response:
    from eagle3.serve.protocol import SamplingParams

    backend = request.app[BACKEND]
    ids = backend.encode("health") or [0]
    await backend.generate(f"health-{uuid.uuid4().hex}", ids, SamplingParams(max_new_tokens=1, temperature=0.0))
    return web.Response(text="")


async def get_model_info(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    args = request.app[ARGS]
    info = {
        "model_path": args.model_path or "synthetic",
        "tokenizer_path": args.tokenizer_path or args.model_path,
        "is_generation": True,
        "architectures": backend.architectures,
        "synthetic": backend.synthetic,
        "server": "eagle3-reference",
    }
    if backend.synthetic:
        info["note"] = "synthetic load mode for the client-scaling benchmark: no model, outputs are meaningless"
    return web.json_response(info)


async def get_server_info(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    info = server_info(request.app[ARGS])
    info["context_length"] = backend.context_length
    info["internal_states"] = [backend.counters()]
    info["version"] = "eagle3-reference"
    return web.json_response(info)


async def flush_cache(request: web.Request) -> web.Response:
    return web.Response(text="Cache flushed (the reference server keeps no prefix cache).\n")


def build_app(args: argparse.Namespace, backend: Any) -> web.Application:
    app = web.Application(client_max_size=64 * 2**20)
    app[ARGS] = args
    app[BACKEND] = backend
    app[FAULTS] = FaultInjector(args)
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_get("/get_model_info", get_model_info)
    app.router.add_get("/get_server_info", get_server_info)
    app.router.add_post("/flush_cache", flush_cache)
    app.router.add_get("/flush_cache", flush_cache)

    async def _close(app: web.Application) -> None:
        app[BACKEND].close()

    app.on_cleanup.append(_close)
    return app
