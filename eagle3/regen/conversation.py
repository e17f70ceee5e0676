"""Regenerate one conversation turn by turn and build its regen row.

Turns: the original assistant turns are discarded; a reply is generated at each place the original
had one (and after a trailing user turn), conditioned on the history regenerated so far. Every
prompt is rendered once by the project (``render_prompt``) and sent as token ids.

Stored ids: ``input_ids`` = the last turn's prompt ids exactly as sent + the output ids exactly as
received, so capture never re-tokenizes model output. ``loss_mask`` = 1 on the earlier (regenerated)
assistant spans of the prompt and on every output id. The prompt's mask comes from
``render_conversation`` of the history when its ids are a prefix of the sent ids (the normal case);
otherwise (a BPE merge across the generation prompt) from the assistant character spans mapped onto
the sent ids through the tokenizer's offsets ("mask_fallback" in meta).

Resume: every turn but the last is handed to ``SampleContext.on_turn`` as a turn record (the
journal's turn line), and ``regenerate`` given a sample's earlier records replays them instead of
asking again: a kill redoes only the turns in flight. The replayed history is what the server said,
so the resumed sample is the one an unbroken run would have produced.

Thinking, tool-calling targets (``regen.reasoning_parser``, ``regen.tool_call_parser``;
``eagle3.data.dialect``): a reply's text is kept in the history as the template's assistant message
(``reasoning_content``, ``content``, ``tool_calls``), so each next prompt shows the earlier turns by
the template's own rule (a thinking template drops earlier turns' reasoning; ``meta.history`` says
``template`` when the last prompt's history was rewritten so, and ``prompt_char_spans`` finds its
turns). The last turn's output ids, thinking included, are the row's tail exactly as received. Tool
results are replayed from the source (no tool is run), answering the regenerated calls in order;
when the target calls a different number of tools than the source answered, the conversation ends at
that turn (``meta.stopped``). ``regen.thinking`` reaches the template as ``chat_template_kwargs``
(both renderers: the project's, and the server's on the OpenAI path); there, the thinking a server's
reasoning parser split off into ``reasoning_content`` is joined back before the text is tokenized
(``ReasoningFormat.join``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import dropwhile
from typing import Any

from eagle3.data.dialect import ReasoningFormat, ToolCallFormat
from eagle3.data.template import (
    NO_OPTIONS,
    ChatOptions,
    TemplateError,
    assistant_char_spans,
    prompt_char_spans,
    render_conversation,
    render_prompt,
    render_text,
    span_mask,
    template_messages,
)
from eagle3.regen.client import BadRequestError, Client, Reply
from eagle3.regen.journal import TURN_KEY
from eagle3.regen.schema import STATUS_FAILED, STATUS_OK, STATUS_TRUNCATED

Message = dict[str, Any]


@dataclass
class SampleContext:
    """What every sample of a run shares: the tokenizer, the client, the API, the truncation
    policy."""

    tokenizer: Any
    client: Client
    api: str = "generate"
    model: str = ""
    eos_id: int | None = None
    # gets the record of every turn before the last
    on_turn: Callable[[dict[str, Any]], None] | None = None
    reasoning: ReasoningFormat | None = None  # regen.reasoning_parser
    calls: ToolCallFormat | None = None  # regen.tool_call_parser
    # chat_template_kwargs (regen.thinking)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_turns: int | None = None  # regen.max_turns: the first turns only

    def options(self, row: dict[str, Any]) -> ChatOptions:
        """What every rendering of ``row`` shares: its tools and the template's arguments."""
        tools = json.loads(row["tools"]) if row.get("tools") else None
        return ChatOptions(tools=tools, kwargs=dict(self.template_kwargs))

    def assistant(self, text: str) -> Message:
        """A reply's text as the template's assistant message (thinking and calls apart when the
        dialect says so)."""
        reasoning = None
        if self.reasoning is not None:
            reasoning, text = self.reasoning.split(
                text, forced=self.reasoning.is_on(self.template_kwargs)
            )
        calls: list[dict[str, str]] = []
        if self.calls is not None:
            text, calls = self.calls.parse(text)
        return {
            "role": "assistant",
            "content": text,
            "reasoning_content": reasoning,
            "tool_calls": calls or None,
        }


@dataclass
class _Turns:
    options: ChatOptions = NO_OPTIONS
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
    tool_results: int = 0  # source tool results replayed
    stopped: str | None = None  # why the conversation ended before the source's did
    turns_cut: int = 0  # the source's turns after regen.max_turns, left out


@dataclass(frozen=True)
class PromptMask:
    mask: list[int]
    # spans mapped through character offsets (a BPE merge across the generation prompt)
    fallback: bool
    # the template showed earlier turns otherwise than generated (a thinking template's rule)
    rewritten: bool


def _offset_mask(
    tokenizer: Any, text: str, spans: list[tuple[int, int]], prompt_ids: list[int]
) -> list[int]:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"]) != prompt_ids:
        raise ValueError(
            "re-rendering the prompt did not reproduce the ids that were sent; is the template stable?"
        )
    return span_mask(enc["offset_mapping"], spans)


def prompt_mask(
    tokenizer: Any, history: list[Message], prompt_ids: list[int], options: ChatOptions = NO_OPTIONS
) -> PromptMask:
    """Loss mask over the sent prompt ids: 1 on the earlier assistant spans."""
    if not any(m["role"] == "assistant" for m in history):
        return PromptMask([0] * len(prompt_ids), False, False)
    try:
        rendered = render_conversation(tokenizer, history, options)
    except TemplateError:  # the template rewrites earlier turns
        text, spans = prompt_char_spans(tokenizer, history, options)
        return PromptMask(_offset_mask(tokenizer, text, spans, prompt_ids), False, True)
    n = len(rendered.input_ids)
    if prompt_ids[:n] == rendered.input_ids:
        return PromptMask(list(rendered.loss_mask) + [0] * (len(prompt_ids) - n), False, False)
    text = render_text(tokenizer, history, add_generation_prompt=True, options=options)
    _full, spans = assistant_char_spans(tokenizer, history, options)
    return PromptMask(_offset_mask(tokenizer, text, spans, prompt_ids), True, False)


def round_trips(tokenizer: Any, ids: list[int]) -> bool:
    """Whether decoding ``ids`` and encoding the text again gives the same ids."""
    return list(tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"]) == list(
        ids
    )


def user_runs(messages: list[Message]) -> list[list[Message]]:
    """The non-assistant messages before each reply to generate: one run per stretch between
    assistant turns (the original assistant turns are discarded; a leading or repeated assistant
    turn asks nothing)."""
    runs: list[list[Message]] = []
    after_assistant = True
    for message in messages:
        if message["role"] == "assistant":
            after_assistant = True
            continue
        if after_assistant:
            runs.append([])
            after_assistant = False
        kept = {"role": message["role"], "content": message["content"]}
        if message.get("tool_call_id"):
            kept["tool_call_id"] = message["tool_call_id"]
        runs[-1].append(kept)
    return runs


def replay_results(state: _Turns, run: list[Message], turn: int, *, structured: bool) -> bool:
    """Add ``run`` to the history; with ``structured`` calls (a tool-call parser), its leading tool
    results answer the last regenerated turn's calls in order, and a different number of calls than
    results ends the conversation: False, ``state.stopped`` says why."""
    results = len(run) - len(list(dropwhile(lambda m: m["role"] == "tool", run)))
    if results and structured:
        calls = (state.history[-1].get("tool_calls") or []) if state.history else []
        if len(calls) != results:
            state.stopped = f"turn {turn}: the target made {len(calls)} tool calls, the source has {results} results"
            return False
        run = [
            {**m, "tool_call_id": call["id"]} for m, call in zip(run, calls, strict=False)
        ] + run[results:]
    state.tool_results += results
    state.history.extend(run)
    return True


async def _chat(ctx: SampleContext, base_rid: str, state: _Turns) -> Reply:
    """One OpenAI-API turn: the history in OpenAI's shape, the text rebuilt from a reasoning
    parser's split."""
    options = state.options
    reply = await ctx.client.chat(
        base_rid,
        template_messages(state.history),
        ctx.model,
        tools=options.tools,
        template_kwargs=options.kwargs,
    )
    if ctx.reasoning is not None:
        forced = ctx.reasoning.is_on(options.kwargs)
        reply.text = ctx.reasoning.join(
            reply.reasoning, reply.text, forced=forced, finished=reply.finish_reason == "stop"
        )
    return reply


async def _turn(ctx: SampleContext, sample_id: str, state: _Turns) -> dict[str, Any]:
    """Generate the next turn; returns its turn record (what the journal keeps of it)."""
    base_rid = f"{sample_id}:{state.turns}"  # the client appends -a<attempt>: one rid per attempt
    state.prompt_history = list(state.history)
    state.prompt_ids = render_prompt(ctx.tokenizer, state.history, state.options)
    if ctx.api == "openai":
        reply = await _chat(ctx, base_rid, state)
        ids = list(ctx.tokenizer(reply.text, add_special_tokens=False)["input_ids"])
        if reply.finish_reason == "stop" and ctx.eos_id is not None:
            ids.append(ctx.eos_id)
        reply.output_ids = ids
    else:
        reply = await ctx.client.generate(base_rid, state.prompt_ids)
    state.last = reply
    record = {
        "sample_id": sample_id,
        TURN_KEY: state.turns,
        "text": reply.text,
        "finish_reason": reply.finish_reason,
        "completion_tokens": len(reply.output_ids),
        "round_trip": round_trips(ctx.tokenizer, reply.output_ids),
        "latency_s": reply.latency_s,
        "attempts": reply.attempts,
        "server": reply.server,
    }
    _add_turn(ctx, state, record)
    return record


def _add_turn(ctx: SampleContext, state: _Turns, record: dict[str, Any]) -> None:
    """Count one finished turn (generated now or replayed from the journal) into the sample's
    state."""
    state.turns += 1
    state.latency_s += record["latency_s"]
    state.attempts += record["attempts"]
    state.completion_tokens += record["completion_tokens"]
    state.truncated |= record["finish_reason"] == "length"
    state.round_trip &= record["round_trip"]
    state.history.append(ctx.assistant(record["text"]))


async def regenerate(
    ctx: SampleContext, row: dict[str, Any], done_turns: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The regen row for one prompts row (failed rows carry the server's message in ``error``);
    ``done_turns``: the records of its first turns from an earlier run, replayed rather than
    generated again."""
    if row.get("input_ids") is not None:
        return pretokenized_row(row)
    runs = user_runs(row["messages"])
    if not runs:
        return failed_row(
            row, "no turn to regenerate (the conversation has no user turn)", attempts=0
        )
    state = _Turns(options=ctx.options(row))
    if ctx.max_turns is not None and len(runs) > ctx.max_turns:
        state.turns_cut, runs = len(runs) - ctx.max_turns, runs[: ctx.max_turns]
    replay = (done_turns or [])[: len(runs) - 1]  # the last turn is never journaled as a turn line
    try:
        for k, run in enumerate(runs):
            if not replay_results(state, run, k, structured=ctx.calls is not None):
                break
            if k < len(replay):
                _add_turn(ctx, state, replay[k])
                continue
            record = await _turn(ctx, row["sample_id"], state)
            if k < len(runs) - 1 and ctx.on_turn is not None:
                ctx.on_turn(record)
    except BadRequestError as exc:
        return failed_row(row, str(exc), attempts=state.attempts + 1)
    return _row(ctx, row, state)


def _meta(ctx: SampleContext, state: _Turns, prompt: PromptMask) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "api": ctx.api,
        "turns": state.turns,
        "total_completion_tokens": state.completion_tokens,
        "round_trip": state.round_trip,
        "mask_fallback": prompt.fallback,
        "retokenized": ctx.api == "openai",
    }
    if state.turns_cut:
        meta["turns_cut"] = state.turns_cut
    if ctx.reasoning is not None or ctx.calls is not None or state.tool_results:
        meta |= {
            "history": "template" if prompt.rewritten else "as_generated",
            "tool_results": state.tool_results,
            "stopped": state.stopped,
            "chat_template_kwargs": state.options.kwargs,
        }
    if ctx.api == "openai":
        meta["caveat"] = (
            "OpenAI path: output ids re-tokenized from text; EOS appended on finish_reason=stop"
        )
        if ctx.reasoning is not None:
            meta["caveat"] += (
                "; thinking joined back from reasoning_content (think_end as a finished turn writes it)"
            )
    return meta


def _row(ctx: SampleContext, row: dict[str, Any], state: _Turns) -> dict[str, Any]:
    assert state.last is not None
    prompt = prompt_mask(ctx.tokenizer, state.prompt_history, state.prompt_ids, state.options)
    out = state.last.output_ids
    return {
        "sample_id": row["sample_id"],
        "source": row.get("source"),
        "messages": state.history,
        "input_ids": state.prompt_ids + out,
        "loss_mask": prompt.mask + [1] * len(out),
        "finish_reason": state.last.finish_reason,
        "prompt_tokens": len(state.prompt_ids),
        "completion_tokens": len(out),
        "server": state.last.server,
        "latency_s": state.latency_s,
        "attempts": state.attempts,
        "status": STATUS_TRUNCATED if state.truncated else STATUS_OK,
        "error": None,
        "meta": json.dumps(_meta(ctx, state, prompt)),
    }


def pretokenized_row(row: dict[str, Any]) -> dict[str, Any]:
    """Rows already in the target's token space pass straight through. A served row
    (``eagle3.data.served``) keeps its provenance: the server (``served:<host>_<rank>``), finish
    reason, latency and token counts as served; ``served.keep_truncated`` decided its
    truncation, so it is never set aside as truncated here."""
    ids = list(row["input_ids"])
    mask = list(row["loss_mask"]) if row.get("loss_mask") is not None else [1] * len(ids)
    served = json.loads(row.get("meta") or "{}").get("served")
    out = {
        "sample_id": row["sample_id"],
        "source": row.get("source"),
        "messages": row.get("messages") or [],
        "input_ids": ids,
        "loss_mask": mask,
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
    if served:
        answer = sum(mask)
        meta = {"api": "served", "turns": 1, "round_trip": True, "served": served}
        out |= {
            "finish_reason": served.get("finish_reason"),
            "prompt_tokens": len(ids) - answer,
            "completion_tokens": answer,
            "server": f"{SERVED_PREFIX}{served.get('server')}",
            "latency_s": float(served.get("e2e_latency") or 0.0),
            "meta": json.dumps(meta),
        }
    return out


SERVED_PREFIX = "served:"  # the ``server`` of a served row


def source_messages(messages: list[Message], max_turns: int | None) -> list[Message]:
    """``messages`` up to their last answer, or their ``max_turns``-th: what ``source_row`` trains
    on."""
    answers = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if max_turns is not None:
        answers = answers[:max_turns]
    return list(messages[: answers[-1] + 1]) if answers else []


def source_row(
    tokenizer: Any, row: dict[str, Any], *, max_turns: int | None = None
) -> dict[str, Any]:
    """The row with the dataset's own answers (``regen.answers=source``): the conversation rendered
    with the target's template, the loss on its answers, no server asked; a row without an answer
    fails."""
    if row.get("input_ids") is not None:
        return pretokenized_row(row)
    messages = source_messages(row["messages"], max_turns)
    if not messages:
        no_answer = "the source has no answer to keep (regen.answers=source)"
        return failed_row(row, no_answer, attempts=0)
    tools = json.loads(row["tools"]) if row.get("tools") else None
    try:
        rendered = render_conversation(tokenizer, messages, ChatOptions(tools=tools))
    except TemplateError as exc:
        return failed_row(row, f"cannot render the conversation: {exc}", attempts=0)
    answered = sum(rendered.loss_mask)
    turns = sum(m["role"] == "assistant" for m in messages)
    cut = sum(m["role"] == "assistant" for m in row["messages"]) - turns
    meta = {"api": "source", "turns": turns, "round_trip": True}
    if cut:
        meta["turns_cut"] = cut
    return {
        "sample_id": row["sample_id"],
        "source": row.get("source"),
        "messages": messages,
        "input_ids": rendered.input_ids,
        "loss_mask": rendered.loss_mask,
        "finish_reason": "source",
        "prompt_tokens": len(rendered.input_ids) - answered,
        "completion_tokens": answered,
        "server": "source",
        "latency_s": 0.0,
        "attempts": 0,
        "status": STATUS_OK,
        "error": None,
        "meta": json.dumps(meta),
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
