"""Validation of request bodies: everything a client can get wrong becomes a ``BadRequest`` (HTTP
400).

The message names the field and the fix, the way SGLang's 400s do, and the client stores it verbatim
as the failed sample's ``error``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError

from eagle3.serve.reference.protocol import SamplingParams


class BadRequest(ValueError):
    """A request the server refuses (400); the message is sent to the client.

    ``plain`` bodies are SGLang's sampling-parameter decoding errors, ``{"error": "<message>"}``;
    the others are ``{"error": {"message": "<message>"}}``
    (``http_server._create_error_response``)."""

    def __init__(self, message: str, *, plain: bool = False) -> None:
        super().__init__(message)
        self.plain = plain


@dataclass
class GenerateRequest:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    stream: bool
    # chat: the template's arguments
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # chat: split the thinking into reasoning_content (with a reasoning parser)
    separate_reasoning: bool = True


# SGLang 0.5.23's sampling parameters, in the order its decoder lists them in an unknown-field
# error; the reference server implements the first group and takes the others only at their no-op
# value (anything else is a 400).
IMPLEMENTED = (
    "max_new_tokens",
    "stop",
    "temperature",
    "top_p",
    "top_k",
    "ignore_eos",
    "sampling_seed",
)
SGLANG_SAMPLING_FIELDS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "min_p": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_new_tokens": (0,),
    "n": (1,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "no_stop_trim": (False,),
    "stop_token_ids": ([],),
    "logit_bias": ({},),
}


def _serde_type(value: Any) -> str:
    """How SGLang's sampling-parameter decoder names the JSON type of ``value`` in an ``invalid
    type`` error."""
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f"string {json.dumps(value)}"
    return "sequence" if isinstance(value, list) else "map"


def _typed(raw: dict[str, Any], name: str, expected: str) -> Any:
    """``raw[name]`` when it decodes as SGLang's decoder expects (``i64``, ``f64`` or ``a
    boolean``)."""
    value = raw[name]
    ok = {
        "i64": isinstance(value, int) and not isinstance(value, bool),
        "f64": isinstance(value, (int, float)) and not isinstance(value, bool),
        "a boolean": isinstance(value, bool),
    }[expected]
    if not ok:
        raise BadRequest(f"invalid type: {_serde_type(value)}, expected {expected}", plain=True)
    return value


def _check_fields(raw: dict[str, Any]) -> None:
    unknown = [k for k in raw if k not in SGLANG_SAMPLING_FIELDS]
    if unknown:
        expected = ", ".join(f"`{f}`" for f in SGLANG_SAMPLING_FIELDS)
        raise BadRequest(f"unknown field `{unknown[0]}`, expected one of {expected}", plain=True)
    for name, value in raw.items():
        if (
            name not in IMPLEMENTED
            and value is not None
            and value not in NO_OP_VALUES.get(name, ())
        ):
            raise BadRequest(
                f"sampling_params.{name}={value!r} is not supported by the reference server (SGLang "
                f"takes it): leave it out or use real SGLang"
            )


def parse_sampling(raw: Any, *, default_max_new_tokens: int = 128) -> SamplingParams:
    """SGLang's ``sampling_params`` with its checks and messages (``sampling/sampling_params.py``
    ``verify``)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest(f"sampling_params must be an object, got {type(raw).__name__}")
    _check_fields(raw)
    p = SamplingParams(max_new_tokens=default_max_new_tokens)
    if raw.get("max_new_tokens") is not None:
        p.max_new_tokens = _typed(raw, "max_new_tokens", "i64")
        if p.max_new_tokens < 0:
            raise BadRequest(f"max_new_tokens must be at least 0, got {p.max_new_tokens}.")
    if raw.get("temperature") is not None:
        p.temperature = float(_typed(raw, "temperature", "f64"))
        if not 0 <= p.temperature < float("inf"):
            raise BadRequest(
                f"temperature must be a non-negative finite number, got {raw['temperature']}."
            )
    if raw.get("top_p") is not None:
        p.top_p = float(_typed(raw, "top_p", "f64"))
        if not 0 < p.top_p <= 1:
            raise BadRequest(f"top_p must be in (0, 1], got {raw['top_p']}.")
    if raw.get("top_k") is not None:
        p.top_k = _typed(raw, "top_k", "i64")
        if p.top_k < 1 and p.top_k != -1:
            raise BadRequest(f"top_k must be -1 (disable) or at least 1, got {p.top_k}.")
    stop = raw.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BadRequest(
                f"invalid type: {_serde_type(raw['stop'])}, expected a value or an array of values for "
                "StringOrList",
                plain=True,
            )
        p.stop = stop
    if raw.get("ignore_eos") is not None:
        p.ignore_eos = _typed(raw, "ignore_eos", "a boolean")
    if raw.get("sampling_seed") is not None:
        p.sampling_seed = _typed(raw, "sampling_seed", "i64")
        if not -(2**63) <= p.sampling_seed <= 2**63 - 1:
            raise BadRequest(
                f"sampling_seed must be in [-2**63, 2**63 - 1], got {p.sampling_seed}."
            )
    return p


def check_ids(ids: Any, generator: Any) -> list[int]:
    if not isinstance(ids, list):
        raise BadRequest("input_ids must be a list of token ids")
    if not ids:
        raise BadRequest("input_ids cannot be empty.")
    if all(isinstance(i, list) for i in ids):
        raise BadRequest(
            "batched input_ids are not served by the reference server: send one prompt per request"
        )
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise BadRequest("input_ids must contain integers only")
    bad = [i for i in ids if not 0 <= i < generator.vocab_size]
    # SGLang 0.5.23 has no such check: its scheduler dies on the embedding lookup
    # (docs/ARCHITECTURE.md)
    if bad:
        raise BadRequest(
            f"input_ids has {len(bad)} ids outside the vocabulary [0, {generator.vocab_size}): {bad[:5]}"
        )
    return ids


def check_length(n: int, params: SamplingParams, raw: Any, context: int) -> None:
    """SGLang's two length checks (``TokenizerManager._validate_one_request``): the prompt alone,
    then the prompt plus an explicitly requested ``max_new_tokens``."""
    if n >= context:
        raise BadRequest(
            f"The input ({n} tokens) is longer than the model's context length ({context} tokens)."
        )
    requested = raw.get("max_new_tokens") if isinstance(raw, dict) else None
    if requested is not None and requested + n > context:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {context} tokens. You requested "
            f"a total of {requested + n} tokens: {n} tokens from the input messages and {requested} tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the completion to fit within "
            "the limit."
        )


def _duplicate_rids(body: dict[str, Any]) -> None:
    """A batch naming one rid twice: SGLang's 400, checked before anything else of the batch."""
    rids = body.get("rid")
    if isinstance(rids, list):
        seen: set[Any] = set()
        dups = [r for r in rids if r in seen or seen.add(r)]
        if dups:
            raise BadRequest(
                f"Duplicate request IDs detected within the request: {sorted(set(dups))}"
            )


def _body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def parse_generate(body: Any, generator: Any) -> GenerateRequest:
    body = _body(body)
    _duplicate_rids(body)
    if body.get("input_ids") is None and body.get("text") is None:
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")
    if body.get("input_ids") is not None and body.get("text") is not None:
        raise BadRequest("give exactly one of input_ids or text")
    if body.get("text") is not None:
        # SGLang's CPU scheduler dies on "" (ARCHITECTURE)
        if not isinstance(body["text"], str) or not body["text"]:
            raise BadRequest(
                "text must be a non-empty string (batched text is not served by the reference server)"
            )
        ids = check_ids(generator.encode(body["text"]), generator)
    else:
        ids = check_ids(body["input_ids"], generator)
    rid = body.get("rid") or uuid.uuid4().hex
    if not isinstance(rid, str):
        raise BadRequest("rid must be a string")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"invalid type: {_serde_type(stream)}, expected a boolean", plain=True)
    params = parse_sampling(body.get("sampling_params"))
    check_length(len(ids), params, body.get("sampling_params"), generator.context_length)
    return GenerateRequest(rid, ids, params, stream)


def _chat_message(m: Any) -> dict[str, Any]:
    """One message as SGLang hands it to the template: an assistant turn that only calls may have no
    content, and its calls' JSON-text arguments are parsed (SGLang's
    ``normalize_assistant_tool_call_arguments``)."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise BadRequest("every message needs a string role and a string content")
    calls = m.get("tool_calls") if m["role"] == "assistant" else None
    if not isinstance(m.get("content"), str) and not (calls and m.get("content") is None):
        raise BadRequest("every message needs a string role and a string content")
    if not calls:
        return m
    if not isinstance(calls, list) or not all(
        isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls
    ):
        raise BadRequest(
            "tool_calls must be a list of {id, type, function: {name, arguments}} objects"
        )
    parsed = []
    for call in calls:
        arguments = call["function"].get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            raise BadRequest("Assistant tool call function.arguments must be valid JSON.") from None
        if not isinstance(arguments, dict):
            raise BadRequest("Assistant tool call function.arguments must be a JSON object.")
        parsed.append({**call, "function": {**call["function"], "arguments": arguments}})
    return {**m, "tool_calls": parsed}


def _chat_options(body: dict[str, Any]) -> tuple[list[Any] | None, dict[str, Any], bool]:
    tools, kwargs = body.get("tools"), body.get("chat_template_kwargs") or {}
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("tools must be a list of tool objects")
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object")
    separate = body.get("separate_reasoning", True)
    if not isinstance(separate, bool):
        raise BadRequest("separate_reasoning must be true or false")
    return tools, kwargs, separate


def parse_chat(body: Any, generator: Any) -> GenerateRequest:
    """An OpenAI chat request, rendered with the tokenizer's chat template (with the request's
    ``tools`` and ``chat_template_kwargs``). Only ``n=1``, no streaming."""
    body = _body(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content} objects")
    messages = [_chat_message(m) for m in messages]
    tools, kwargs, separate = _chat_options(body)
    if body.get("stream"):
        raise BadRequest(
            "stream=true is not supported on /v1/chat/completions by the reference server"
        )
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
    try:
        rendered = generator.chat_ids(messages, tools=tools, kwargs=kwargs)
    # the template refused the messages: 400, as in SGLang
    except (TypeError, ValueError, TemplateError) as exc:
        raise BadRequest(f"the chat template cannot render these messages: {exc}") from None
    ids = check_ids(rendered, generator)
    rid = body.get("rid") or f"chatcmpl-{uuid.uuid4().hex}"
    params = parse_sampling({k: v for k, v in raw.items() if v is not None})
    check_length(len(ids), params, raw, generator.context_length)
    return GenerateRequest(str(rid), ids, params, False, kwargs, separate)
