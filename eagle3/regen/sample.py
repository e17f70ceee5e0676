"""Regenerate one conversation turn by turn and build its regen row.

Turns: the original assistant turns are discarded; a reply is generated at each place the original had one (and
after a trailing user turn), conditioned on the history regenerated so far. Every prompt is rendered once by the
project (``render_prompt``) and sent as token ids.

Stored ids: ``input_ids`` = the last turn's prompt ids exactly as sent + the output ids exactly as received, so
capture never re-tokenizes model output. ``loss_mask`` = 1 on the earlier (regenerated) assistant spans of the
prompt and on every output id. The prompt's mask comes from ``render_conversation`` of the history when its ids
are a prefix of the sent ids (the normal case); otherwise (a BPE merge across the generation prompt) from the
assistant character spans mapped onto the sent ids through the tokenizer's offsets ("mask_fallback" in meta).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from eagle3.data.template import assistant_char_spans, render_conversation, render_prompt
from eagle3.regen.client import BadRequestError, Client, Reply
from eagle3.regen.schema import STATUS_FAILED, STATUS_OK, STATUS_TRUNCATED

Message = dict[str, str]


@dataclass
class SampleContext:
    """What every sample of a run shares: the tokenizer, the client, the API, the truncation policy."""

    tokenizer: Any
    client: Client
    api: str = "generate"
    model: str = ""
    eos_id: int | None = None


@dataclass
class _Turns:
    history: list[Message] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    prompt_history: list[Message] = field(default_factory=list)
    last: Reply | None = None
    latency_s: float = 0.0
    attempts: int = 0
    turns: int = 0
    completion_tokens: int = 0
    truncated: bool = False
    round_trip: bool = True


def prompt_mask(tokenizer: Any, history: list[Message], prompt_ids: list[int]) -> tuple[list[int], bool]:
    """Loss mask over the sent prompt ids (1 on earlier assistant spans) and whether the fallback was needed."""
    if not any(m["role"] == "assistant" for m in history):
        return [0] * len(prompt_ids), False
    rendered = render_conversation(tokenizer, history)
    n = len(rendered.input_ids)
    if prompt_ids[:n] == rendered.input_ids:
        return list(rendered.loss_mask) + [0] * (len(prompt_ids) - n), False
    text = tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"]) != prompt_ids:
        raise ValueError("re-rendering the prompt did not reproduce the ids that were sent; is the template stable?")
    _full, spans = assistant_char_spans(tokenizer, history)
    mask = [int(any(a <= start < b for a, b in spans)) for start, _end in enc["offset_mapping"]]
    return mask, True


def round_trips(tokenizer: Any, ids: list[int]) -> bool:
    """Whether decoding ``ids`` and encoding the text again gives the same ids."""
    return list(tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"]) == list(ids)


async def _turn(ctx: SampleContext, sample_id: str, state: _Turns) -> None:
    base_rid = f"{sample_id}:{state.turns}"  # the client appends -a<attempt>: one rid per attempt
    state.prompt_history = list(state.history)
    state.prompt_ids = render_prompt(ctx.tokenizer, state.history)
    if ctx.api == "openai":
        reply = await ctx.client.chat(base_rid, state.history, ctx.model)
        ids = list(ctx.tokenizer(reply.text, add_special_tokens=False)["input_ids"])
        if reply.finish_reason == "stop" and ctx.eos_id is not None:
            ids.append(ctx.eos_id)
        reply.output_ids = ids
    else:
        reply = await ctx.client.generate(base_rid, state.prompt_ids)
    state.last = reply
    state.turns += 1
    state.latency_s += reply.latency_s
    state.attempts += reply.attempts
    state.completion_tokens += len(reply.output_ids)
    state.truncated |= reply.finish_reason == "length"
    state.round_trip &= round_trips(ctx.tokenizer, reply.output_ids)
    state.history.append({"role": "assistant", "content": reply.text})


async def regenerate(ctx: SampleContext, row: dict[str, Any]) -> dict[str, Any]:
    """The regen row for one prompts row (failed rows carry the server's message in ``error``)."""
    if row.get("input_ids") is not None:
        return pretokenized_row(row)
    state = _Turns()
    try:
        for message in row["messages"]:
            if message["role"] == "assistant":
                if state.history and state.history[-1]["role"] != "assistant":
                    await _turn(ctx, row["sample_id"], state)
                continue
            state.history.append({"role": message["role"], "content": message["content"]})
        if state.history and state.history[-1]["role"] != "assistant":
            await _turn(ctx, row["sample_id"], state)
    except BadRequestError as exc:
        return failed_row(row, str(exc), attempts=state.attempts + 1)
    if state.last is None:
        return failed_row(row, "no turn to regenerate (the conversation has no user turn)", attempts=0)
    return _row(ctx, row, state)


def _row(ctx: SampleContext, row: dict[str, Any], state: _Turns) -> dict[str, Any]:
    assert state.last is not None
    mask, fallback = prompt_mask(ctx.tokenizer, state.prompt_history, state.prompt_ids)
    out = state.last.output_ids
    meta = {
        "api": ctx.api,
        "turns": state.turns,
        "total_completion_tokens": state.completion_tokens,
        "round_trip": state.round_trip,
        "mask_fallback": fallback,
        "retokenized": ctx.api == "openai",
    }
    if ctx.api == "openai":
        meta["caveat"] = "OpenAI path: output ids re-tokenized from text; EOS appended on finish_reason=stop"
    return {
        "sample_id": row["sample_id"],
        "source": row.get("source"),
        "messages": state.history,
        "input_ids": state.prompt_ids + out,
        "loss_mask": mask + [1] * len(out),
        "finish_reason": state.last.finish_reason,
        "prompt_tokens": len(state.prompt_ids),
        "completion_tokens": len(out),
        "server": state.last.server,
        "latency_s": state.latency_s,
        "attempts": state.attempts,
        "status": STATUS_TRUNCATED if state.truncated else STATUS_OK,
        "error": None,
        "meta": json.dumps(meta),
    }


def pretokenized_row(row: dict[str, Any]) -> dict[str, Any]:
    """Rows already in the target's token space pass straight through."""
    ids = list(row["input_ids"])
    return {
        "sample_id": row["sample_id"],
        "source": row.get("source"),
        "messages": row.get("messages") or [],
        "input_ids": ids,
        "loss_mask": list(row["loss_mask"]) if row.get("loss_mask") is not None else [1] * len(ids),
        "finish_reason": "pretokenized",
        "prompt_tokens": len(ids),
        "completion_tokens": 0,
        "server": "pretokenized",
        "latency_s": 0.0,
        "attempts": 0,
        "status": STATUS_OK,
        "error": None,
        "meta": json.dumps({"api": "none", "turns": 0, "round_trip": True}),
    }


def failed_row(row: dict[str, Any], error: str, *, attempts: int) -> dict[str, Any]:
    return {
        "sample_id": row["sample_id"],
        "source": row.get("source"),
        "messages": row.get("messages") or [],
        "input_ids": None,
        "loss_mask": None,
        "finish_reason": None,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "server": None,
        "latency_s": 0.0,
        "attempts": attempts,
        "status": STATUS_FAILED,
        "error": error,
        "meta": json.dumps({"round_trip": True}),
    }
