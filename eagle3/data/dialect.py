"""Chat dialects of thinking, tool-calling targets: where a turn's thinking ends and how its tool
calls are written.

Names are SGLang 0.5.23's parser names (``--reasoning-parser``, ``--tool-call-parser``), so one word
configures the server and the project alike. Only the dialects the project has a target for are
registered; an unknown name lists the known ones.

Reasoning (``ReasoningFormat``, SGLang ``srt/parser/reasoning_parser.py``): a turn is ``reasoning +
think_end + content``. When the chat template opens the thinking block in its generation prompt
(``<think>``), the output starts inside it: SGLang calls that *forced* reasoning and turns it on
unless the request sets the template's switch (``toggle``) to false. ``split`` is SGLang's
non-streaming ``detect_and_parse``: a leading ``think_start`` is dropped, the text before the first
``think_end`` is the reasoning; with no ``think_end``, a ``tool_start`` ends the reasoning (kept in
the content), else the whole text is reasoning (cut short). ``join`` inverts it for text a server
split: what a split loses (whether ``think_end`` was written before a tool section, or at the very
end of a turn) is restored by the rule a finished turn follows (it closes its thinking), and the
caller records that it was rebuilt.

Tool calls (``ToolCallFormat``, SGLang ``srt/function_call/kimik2_detector.py``): ``parse`` takes a
turn's content apart into the text before the tool section and the calls in it, each ``{"id",
"name", "arguments"}`` with the arguments exactly as written (a string, JSON when the model wrote
JSON); ``format`` writes calls back, so ``format(parse(text))`` gives ``text`` again for anything
the dialect wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

ToolCall = dict[str, str]  # {"id", "name", "arguments"}


class DialectError(ValueError):
    """An unknown parser name; the message lists the known ones."""


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    think_start: str
    think_end: str
    toggle: str  # the chat template's switch (chat_template_kwargs key); on unless set to false
    tool_start: str | None = None  # text that ends the reasoning when no think_end came before it

    def split(self, text: str, *, forced: bool) -> tuple[str | None, str]:
        """``(reasoning, content)`` as SGLang's parser splits a whole output; reasoning is None
        outside a block."""
        if not forced and self.think_start not in text:
            return None, text
        while text.startswith(self.think_start):
            text = text[len(self.think_start) :]
        if self.think_end in text:
            reasoning, _, content = text.partition(self.think_end)
            return reasoning, content
        cut = text.find(self.tool_start) if self.tool_start else -1
        if cut >= 0:
            return text[:cut], text[cut:]
        return text, ""

    def join(self, reasoning: str | None, content: str, *, forced: bool, finished: bool) -> str:
        """The output text a server split into ``reasoning`` and ``content`` (see the module
        docstring); content that still holds ``think_end`` with no reasoning beside it was not
        split, and is the text as it is."""
        if reasoning is None and self.think_end in content:
            return content
        if not forced:
            return (
                f"{self.think_start}{reasoning}{self.think_end}{content}" if reasoning else content
            )
        if content or finished:
            return f"{reasoning or ''}{self.think_end}{content}"
        return reasoning or ""

    def is_on(self, chat_template_kwargs: dict[str, Any]) -> bool:
        """Whether a request with these template arguments starts inside the thinking block
        (SGLang's rule)."""
        return chat_template_kwargs.get(self.toggle) is not False


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    section_start: str
    section_end: str
    call_start: str
    call_args: str
    call_end: str
    id_pattern: re.Pattern[str]

    def parse(self, content: str) -> tuple[str, list[ToolCall]]:
        """The text outside the tool section (before it, then anything after it) and the calls in
        it."""
        start = content.find(self.section_start)
        if start < 0:
            return content, []
        end = content.find(self.section_end, start)
        body = content[start + len(self.section_start) : end if end >= 0 else len(content)]
        rest = content[end + len(self.section_end) :] if end >= 0 else ""
        calls = []
        pattern = (
            re.escape(self.call_start)
            + r"(.*?)"
            + re.escape(self.call_args)
            + r"(.*?)"
            + re.escape(self.call_end)
        )
        for match in re.finditer(pattern, body, re.DOTALL):
            call_id = match.group(1).strip()
            named = self.id_pattern.match(call_id)
            calls.append(
                {
                    "id": call_id,
                    "name": named.group("name") if named else "",
                    "arguments": match.group(2),
                }
            )
        return content[:start] + rest, calls

    def format(self, calls: list[ToolCall]) -> str:
        """The tool section for ``calls`` (empty for none), as the chat template writes it."""
        if not calls:
            return ""
        body = "".join(
            f"{self.call_start}{c['id']}{self.call_args}{c['arguments']}{self.call_end}"
            for c in calls
        )
        return self.section_start + body + self.section_end

    def call_id(self, name: str, index: int) -> str:
        """The id the model writes for the ``index``-th call of a conversation (0-based)."""
        return f"functions.{name}:{index}"


REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "kimi_k2": ReasoningFormat(
        "kimi_k2", "<think>", "</think>", "thinking", "<|tool_calls_section_begin|>"
    ),
}
TOOL_CALL_FORMATS: dict[str, ToolCallFormat] = {
    "kimi_k2": ToolCallFormat(
        "kimi_k2",
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
        re.compile(r"^(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)$"),
    ),
}


def reasoning_format(name: str) -> ReasoningFormat:
    try:
        return REASONING_FORMATS[name]
    except KeyError:
        known = ", ".join(sorted(REASONING_FORMATS))
        raise DialectError(f"unknown reasoning parser {name!r}; known: {known}") from None


def tool_call_format(name: str) -> ToolCallFormat:
    try:
        return TOOL_CALL_FORMATS[name]
    except KeyError:
        known = ", ".join(sorted(TOOL_CALL_FORMATS))
        raise DialectError(f"unknown tool-call parser {name!r}; known: {known}") from None
