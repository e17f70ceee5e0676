"""The one renderer: the target tokenizer's chat template, applied once, by the project (DESIGN §3).

Regeneration sends these ids to ``/generate`` and capture reads the stored ids back, so nothing downstream
re-tokenizes model output. Assistant spans are found by incremental rendering: rendering ``messages[:i]`` with a
generation prompt must be a prefix of rendering ``messages[:i+1]``; the text between them is the assistant turn,
up to and including the end-of-turn (eos) token: template glue after it is never generated, so it is not trained.
Token ids come from one tokenization of the full text with character offsets, so BPE merges are exactly the ones
the server would see.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Message = dict[str, str]


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be used to locate assistant spans."""


@dataclass(frozen=True)
class Rendered:
    input_ids: list[int]
    loss_mask: list[int]
    text: str


# tokenizer_config.json classes that are the plain fast (``tokenizers``) tokenizer: loaded without AutoTokenizer,
# whose config machinery imports torch and most of transformers (~10 s of a command's start on a busy machine)
_PLAIN_FAST = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _plain_local(path: Path | str) -> bool:
    """Whether ``path`` is a local model directory whose config names the plain fast tokenizer (the class
    AutoTokenizer would pick) and no custom code."""
    config = Path(path) / "tokenizer_config.json"
    declared = json.loads(config.read_text()) if config.is_file() else {}
    return declared.get("tokenizer_class") in _PLAIN_FAST and "auto_map" not in declared


def load_local_tokenizer(path: Path | str) -> Any | None:
    """The tokenizer of a local model directory whose config names the plain fast tokenizer (the class AutoTokenizer
    would pick), loaded without AutoTokenizer; None for anything else (a Hub id, custom code, another class)."""
    if not _plain_local(path):
        return None
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path))


def tokenizer_imports(path: Path | str, *, local: bool = True) -> tuple[str, ...]:
    """What loading the tokenizer of ``path`` imports from transformers (``Stage.unit_imports``): the plain fast
    class for a plain local one (``local``: when the caller tries ``load_local_tokenizer`` first), else
    AutoTokenizer."""
    plain = local and _plain_local(path)
    return ("transformers:PreTrainedTokenizerFast",) if plain else ("transformers:AutoTokenizer",)


def template_hash(tokenizer: Any) -> str:
    """Short hash of the chat template text (recorded with every artifact rendered from it)."""
    template = tokenizer.chat_template or ""
    return hashlib.sha256(template.encode()).hexdigest()[:16]


def _apply(tokenizer: Any, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _encode(tokenizer: Any, text: str) -> Any:
    return tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)


def render_prompt(tokenizer: Any, messages: Sequence[Message]) -> list[int]:
    """Token ids of ``messages`` followed by the generation prompt (what regen sends for the next turn)."""
    if messages and messages[-1]["role"] == "assistant":
        raise TemplateError("render_prompt needs a conversation that does not end with an assistant turn")
    return list(_encode(tokenizer, _apply(tokenizer, messages, add_generation_prompt=True))["input_ids"])


def assistant_char_spans(tokenizer: Any, messages: Sequence[Message]) -> tuple[str, list[tuple[int, int]]]:
    """Full rendered text and the character spans of every assistant turn in it."""
    full = _apply(tokenizer, messages, add_generation_prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = _apply(tokenizer, messages[:i], add_generation_prompt=True)
        upto = _apply(tokenizer, messages[: i + 1], add_generation_prompt=False)
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


def render_conversation(tokenizer: Any, messages: Sequence[Message]) -> Rendered:
    """Token ids of a whole conversation and a loss mask that is 1 on assistant-turn tokens."""
    full, spans = assistant_char_spans(tokenizer, messages)
    enc = _encode(tokenizer, full)
    mask = [0] * len(enc["input_ids"])
    span_iter = iter(spans)
    span = next(span_iter, None)
    for t, (start, _end) in enumerate(enc["offset_mapping"]):
        while span is not None and start >= span[1]:
            span = next(span_iter, None)
        if span is not None and span[0] <= start < span[1]:
            mask[t] = 1
    return Rendered(list(enc["input_ids"]), mask, full)
