"""Validation of request bodies: everything a client can get wrong becomes a ``BadRequest`` (HTTP 400).

The message names the field and the fix, the way SGLang's 400s do, and the client stores it verbatim as the
failed sample's ``error``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from eagle3.serve.protocol import SamplingParams


class BadRequest(ValueError):
    """A request the server refuses (400); the message is sent to the client."""


@dataclass
class GenerateRequest:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    stream: bool


def _number(value: Any, name: str, *, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise BadRequest(f"sampling_params.{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
    return value


def parse_sampling(raw: Any, *, default_max_new_tokens: int = 128) -> SamplingParams:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest(f"sampling_params must be an object, got {type(raw).__name__}")
    p = SamplingParams(max_new_tokens=default_max_new_tokens)
    if raw.get("max_new_tokens") is not None:
        p.max_new_tokens = int(_number(raw["max_new_tokens"], "max_new_tokens", integer=True))
        if p.max_new_tokens <= 0:
            raise BadRequest("sampling_params.max_new_tokens must be > 0")
    if raw.get("temperature") is not None:
        p.temperature = float(_number(raw["temperature"], "temperature"))
        if p.temperature < 0:
            raise BadRequest("sampling_params.temperature must be >= 0")
    if raw.get("top_p") is not None:
        p.top_p = float(_number(raw["top_p"], "top_p"))
        if not 0 < p.top_p <= 1:
            raise BadRequest("sampling_params.top_p must be in (0, 1]")
    if raw.get("top_k") is not None:
        p.top_k = int(_number(raw["top_k"], "top_k", integer=True))
    stop = raw.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BadRequest("sampling_params.stop must be a string or a list of strings")
        p.stop = stop
    if raw.get("ignore_eos") is not None:
        if not isinstance(raw["ignore_eos"], bool):
            raise BadRequest("sampling_params.ignore_eos must be true or false")
        p.ignore_eos = raw["ignore_eos"]
    return p


def check_ids(ids: Any, backend: Any) -> list[int]:
    if not isinstance(ids, list) or not ids:
        raise BadRequest("input_ids must be a non-empty list of token ids (one prompt per request)")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise BadRequest("input_ids must contain integers only (batched input_ids are not supported here)")
    bad = [i for i in ids if not 0 <= i < backend.vocab_size]
    if bad:
        raise BadRequest(f"input_ids has {len(bad)} ids outside the vocabulary [0, {backend.vocab_size}): {bad[:5]}")
    if len(ids) >= backend.context_length:
        raise BadRequest(
            f"the prompt has {len(ids)} tokens, the context length is {backend.context_length}: shorten the prompt"
        )
    return ids


def _body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def parse_generate(body: Any, backend: Any) -> GenerateRequest:
    body = _body(body)
    if (body.get("input_ids") is None) == (body.get("text") is None):
        raise BadRequest("give exactly one of input_ids or text")
    if body.get("text") is not None:
        if not isinstance(body["text"], str) or not body["text"]:
            raise BadRequest("text must be a non-empty string (batched text is not supported here)")
        ids = check_ids(backend.encode(body["text"]), backend)
    else:
        ids = check_ids(body["input_ids"], backend)
    rid = body.get("rid") or uuid.uuid4().hex
    if not isinstance(rid, str):
        raise BadRequest("rid must be a string")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false")
    return GenerateRequest(rid, ids, parse_sampling(body.get("sampling_params")), stream)


def parse_chat(body: Any, backend: Any) -> GenerateRequest:
    """An OpenAI chat request, rendered with the tokenizer's chat template. Only ``n=1``, no streaming."""
    body = _body(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content} objects")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRequest("every message needs a string role and a string content")
    if body.get("stream"):
        raise BadRequest("stream=true is not supported on /v1/chat/completions by the reference server")
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported")
    raw = {
        "max_new_tokens": body.get("max_completion_tokens", body.get("max_tokens")),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "top_k": body.get("top_k"),
        "stop": body.get("stop"),
        "ignore_eos": body.get("ignore_eos"),
    }
    ids = check_ids(backend.chat_ids(messages), backend)
    rid = body.get("rid") or f"chatcmpl-{uuid.uuid4().hex}"
    return GenerateRequest(str(rid), ids, parse_sampling(raw), False)
