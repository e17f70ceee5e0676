"""The messages a rendered prompt was made of, recovered with the target's chat template as the only
oracle.

A served request carries its prompt as token ids (a chat request is rendered by the server; a
``/generate`` client renders its own), not as messages. The project needs the messages to
deduplicate served prompts against the other sources (``sample_id`` hashes the non-assistant turns)
and to decontaminate them against the gate's prompts, and it needs to know the prompt was rendered
with the target's template at all: a prompt written for another template, or raw text, would teach
the draft a context the target is never served in.

How: the template is rendered over sentinel contents (``[user]``, ``[user, assistant, user]``,
``[system, user]``) to learn its glue: the text before the first user turn, before a first system
turn, between a user turn and the next assistant turn and back, after the last user turn and the
generation prompt. A prompt is then cut at those glues into a system turn (optional), then user and
assistant turns alternating, ending on a user turn. The cut is a guess; the proof is rendering the
recovered messages again: only a prompt whose ids equal the rendering's ids exactly is accepted
(``TemplateMismatch`` otherwise, with what differed). A leading system turn that renders the same as
no system turn (a template's default system prompt) is dropped, so a served prompt hashes like the
same conversation from a dataset. Tool turns and templates whose turns change with their position
are not recovered (their prompts are refused, never guessed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagle3.data.template import ChatOptions, Message, render_prompt, render_text

_S = ("\ue000sys\ue001", "\ue000first\ue001", "\ue000answer\ue001", "\ue000next\ue001")


class TemplateMismatch(ValueError):
    """A prompt that is not the target's chat template over some messages; the message says where it
    differs."""


@dataclass(frozen=True)
class Glue:
    """The text a template puts around turn contents (see the module docstring)."""

    user_first: str  # before the content of a first user turn (conversation start + user opening)
    system_first: str  # before the content of a first system turn
    system_user: str  # after a system turn's content, before the next user content
    user_assistant: str  # after a user turn's content, before the next assistant content
    assistant_user: str  # after an assistant turn's content, before the next user content
    tail: str  # after the last user turn's content: its closing and the generation prompt


def _between(text: str, left: str, right: str) -> str:
    start = text.index(left) + len(left)
    return text[start : text.index(right, start)]


def learn_glue(tokenizer: Any, options: ChatOptions | None = None) -> Glue:
    """The glue of ``tokenizer``'s chat template; raises ``TemplateMismatch`` when a probe does not
    render."""
    opts = options or ChatOptions()
    s0, s1, s2, s3 = _S
    user = [{"role": "user", "content": s1}]
    try:
        first = render_text(tokenizer, user, add_generation_prompt=True, options=opts)
        turns = render_text(
            tokenizer,
            [*user, {"role": "assistant", "content": s2}, {"role": "user", "content": s3}],
            add_generation_prompt=True,
            options=opts,
        )
        system = render_text(
            tokenizer,
            [{"role": "system", "content": s0}, *user],
            add_generation_prompt=True,
            options=opts,
        )
    except Exception as exc:  # a template raises what it likes (jinja errors, its own exceptions)
        raise TemplateMismatch(
            f"the chat template does not render a plain user/assistant conversation: {exc}"
        ) from exc
    if not all(s in turns for s in (s1, s2, s3)) or s0 not in system:
        raise TemplateMismatch(
            "the chat template rewrites turn contents; its prompts cannot be recovered"
        )
    return Glue(
        user_first=first[: first.index(s1)],
        system_first=system[: system.index(s0)],
        system_user=_between(system, s0, s1),
        user_assistant=_between(turns, s1, s2),
        assistant_user=_between(turns, s2, s3),
        tail=first[first.index(s1) + len(s1) :],
    )


def cut_prompt(text: str, glue: Glue) -> list[Message]:
    """The turns of a rendered prompt cut at ``glue`` (a guess: ``recover_messages`` proves it)."""
    if not text.endswith(glue.tail):
        raise TemplateMismatch(
            "the prompt does not end with the template's end of a user turn and generation prompt"
        )
    body = text[: len(text) - len(glue.tail)]
    messages: list[Message] = []
    if body.startswith(glue.system_first) and glue.system_first != glue.user_first:
        end = body.find(glue.system_user, len(glue.system_first))
        if end < 0:
            raise TemplateMismatch(
                "a system turn without the template's glue to the next user turn"
            )
        messages.append({"role": "system", "content": body[len(glue.system_first) : end]})
        pos = end + len(glue.system_user)
    elif body.startswith(glue.user_first):
        pos = len(glue.user_first)
    else:
        raise TemplateMismatch(
            "the prompt does not start the way the template starts a conversation"
        )
    while True:  # a user turn, then (assistant, user) pairs until the tail
        end = body.find(glue.user_assistant, pos)
        if end < 0:
            messages.append({"role": "user", "content": body[pos:]})
            return messages
        messages.append({"role": "user", "content": body[pos:end]})
        start = end + len(glue.user_assistant)
        end = body.find(glue.assistant_user, start)
        if end < 0:
            raise TemplateMismatch(
                "an assistant turn without the template's glue to a next user turn"
            )
        messages.append({"role": "assistant", "content": body[start:end]})
        pos = end + len(glue.assistant_user)


def recover_messages(tokenizer: Any, prompt_ids: list[int], glue: Glue) -> list[Message]:
    """The messages whose rendering (with the generation prompt) is exactly ``prompt_ids``; raises
    ``TemplateMismatch`` naming the first token that differs when no cut of the prompt renders back
    to it."""
    text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
    messages = cut_prompt(text, glue)
    rendered = render_prompt(tokenizer, messages)
    if rendered != list(prompt_ids):
        at = next(
            (i for i, (a, b) in enumerate(zip(rendered, prompt_ids, strict=False)) if a != b),
            min(len(rendered), len(prompt_ids)),
        )
        raise TemplateMismatch(
            f"the recovered turns render to other ids (first difference at token {at} of "
            f"{len(prompt_ids)}): a different chat template or tokenizer"
        )
    if messages[0]["role"] == "system" and render_prompt(tokenizer, messages[1:]) == rendered:
        return messages[1:]  # the template's default system prompt
    return messages
