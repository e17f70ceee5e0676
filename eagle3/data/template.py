"""The one renderer: the target tokenizer's chat template, applied once, by the project
(docs/DESIGN.md, "One renderer").

Regeneration sends these ids to ``/generate`` and capture reads the stored ids back, so nothing
downstream re-tokenizes model output. Assistant spans are found by incremental rendering: rendering
``messages[:i]`` with a generation prompt must be a prefix of rendering ``messages[:i+1]``; the text
between them is the assistant turn, up to and including the end-of-turn (eos) token: template glue
after it is never generated, so it is not trained. Token ids come from one tokenization of the full
text with character offsets, so BPE merges are exactly the ones the server would see.

Thinking templates rewrite the history: Kimi-K2.5's drops the reasoning of every turn up to the last
one without tool calls, GLM's and Qwen3's of every turn before the last user turn.
``prompt_char_spans`` finds the assistant turns of such a prompt with the template as the only
oracle: turn by turn, the rendering of the history so far (as the template shows it) must be a
prefix of the prompt, and the turn is whichever of its forms (as generated, or with its reasoning
dropped) keeps it a prefix. A turn's span runs from the end of its generation prompt to its eos, so
it covers what the model wrote there that the template kept (for a turn whose thinking was dropped:
from the end of the empty think block on). Every call renders with the same ``ChatOptions``: the
conversation's tools and the template's keyword arguments (``chat_template_kwargs``, e.g. a thinking
switch). Messages reach the template in OpenAI's shape (``template_messages``): calls as ``{"id",
"type": "function", "function": {"name", "arguments"}}``, unset fields left out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be used to locate assistant spans."""


@dataclass(frozen=True)
class ChatOptions:
    """What every rendering of one conversation shares: its tool declarations and the template's
    arguments."""

    tools: list[dict[str, Any]] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


NO_OPTIONS = ChatOptions()


@dataclass(frozen=True)
class Rendered:
    input_ids: list[int]
    loss_mask: list[int]
    text: str


def template_hash(tokenizer: Any) -> str:
    """Short hash of the chat template text (recorded with every artifact rendered from it)."""
    template = tokenizer.chat_template or ""
    return hashlib.sha256(template.encode()).hexdigest()[:16]


def template_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages as chat templates and OpenAI servers take them: calls nested under ``function``
    (calls already in that shape pass as they are), unset fields out."""
    out = []
    for m in messages:
        message = {k: v for k, v in m.items() if v is not None and k != "tool_calls"}
        if m.get("tool_calls"):
            message["tool_calls"] = [
                c
                if "function" in c
                else {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in m["tool_calls"]
            ]
        out.append(message)
    return out


def render_text(
    tokenizer: Any,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool,
    options: ChatOptions = NO_OPTIONS,
) -> str:
    """The template's text for ``messages`` (the one place it is applied)."""
    return tokenizer.apply_chat_template(
        template_messages(messages),
        tools=options.tools,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **options.kwargs,
    )


def _encode(tokenizer: Any, text: str) -> Any:
    return tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)


def render_prompt(
    tokenizer: Any, messages: Sequence[Message], options: ChatOptions = NO_OPTIONS
) -> list[int]:
    """Token ids of ``messages`` followed by the generation prompt (what regen sends for the next
    turn)."""
    if messages and messages[-1]["role"] == "assistant":
        raise TemplateError(
            "render_prompt needs a conversation that does not end with an assistant turn"
        )
    text = render_text(tokenizer, messages, add_generation_prompt=True, options=options)
    return list(_encode(tokenizer, text)["input_ids"])


def assistant_char_spans(
    tokenizer: Any, messages: Sequence[Message], options: ChatOptions = NO_OPTIONS
) -> tuple[str, list[tuple[int, int]]]:
    """Full rendered text and the character spans of every assistant turn in it."""
    full = render_text(tokenizer, messages, add_generation_prompt=False, options=options)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = render_text(tokenizer, messages[:i], add_generation_prompt=True, options=options)
        upto = render_text(
            tokenizer, messages[: i + 1], add_generation_prompt=False, options=options
        )
        if not upto.startswith(prefix) or not full.startswith(upto):
            raise TemplateError(
                f"chat template is not prefix-stable at turn {i}: rendering the history with a generation prompt "
                "is not a prefix of rendering it with the assistant reply; use a template without history rewriting"
            )
        end = len(upto)
        eos = getattr(tokenizer, "eos_token", None)
        if eos and (cut := upto.rfind(eos, len(prefix))) >= 0:
            end = cut + len(eos)  # template glue after the end-of-turn token is never generated
        spans.append((len(prefix), end))
    return full, spans


def span_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[int]:
    """1 on every token whose first character lies in one of ``spans`` (ascending, disjoint)."""
    mask = [0] * len(offsets)
    span_iter = iter(spans)
    span = next(span_iter, None)
    for t, (start, _end) in enumerate(offsets):
        while span is not None and start >= span[1]:
            span = next(span_iter, None)
        if span is not None and span[0] <= start < span[1]:
            mask[t] = 1
    return mask


def render_conversation(
    tokenizer: Any, messages: Sequence[Message], options: ChatOptions = NO_OPTIONS
) -> Rendered:
    """Token ids of a whole conversation and a loss mask that is 1 on assistant-turn tokens."""
    full, spans = assistant_char_spans(tokenizer, messages, options)
    enc = _encode(tokenizer, full)
    return Rendered(list(enc["input_ids"]), span_mask(enc["offset_mapping"], spans), full)


def _without_reasoning(message: Message) -> Message:
    return {**message, "reasoning_content": None}


def prompt_char_spans(
    tokenizer: Any, history: Sequence[Message], options: ChatOptions = NO_OPTIONS
) -> tuple[str, list[tuple[int, int]]]:
    """The generation-prompt rendering of ``history`` and the spans of its assistant turns, for a
    template that may rewrite earlier turns (module docstring); raises ``TemplateError`` when no
    form of a turn fits."""
    text = render_text(tokenizer, history, add_generation_prompt=True, options=options)
    eos = getattr(tokenizer, "eos_token", None) or ""
    shown: list[Message] = []  # the history so far as the template shows it in `text`
    spans = []
    for i, message in enumerate(history):
        if message["role"] != "assistant":
            shown.append(message)
            continue
        prefix = render_text(tokenizer, shown, add_generation_prompt=True, options=options)
        if not text.startswith(prefix):
            raise TemplateError(f"turn {i}: the history before it is not a prefix of the prompt")
        start = len(prefix)
        for form in (message, _without_reasoning(message)):
            if text.startswith(
                render_text(tokenizer, [*shown, form], add_generation_prompt=False, options=options)
            ):
                shown.append(form)
                break
        else:
            raise TemplateError(
                f"turn {i} fits the prompt neither as generated nor with its reasoning dropped"
            )
        end = text.find(eos, start) if eos else -1
        if end < 0:
            raise TemplateError(f"turn {i} has no end-of-turn token {eos!r} in the prompt")
        spans.append((start, end + len(eos)))
    return text, spans
