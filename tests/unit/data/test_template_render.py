"""The one renderer: chat template applied by the project, assistant spans marked (golden file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eagle3.data.template import TemplateError, render_conversation, render_prompt

GOLDEN = Path(__file__).parent / "golden" / "template_multi_turn.json"
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "2 + 3 = 5."},
    {"role": "user", "content": "And times 4? Ünïcödé ok."},
    {"role": "assistant", "content": "5 * 4 = 20."},
]


def test_multi_turn_rendering_matches_golden(tiny_tokenizer):
    rendered = render_conversation(tiny_tokenizer, CONVERSATION)
    spans = [
        tiny_tokenizer.decode(
            [t for t, m in zip(rendered.input_ids, rendered.loss_mask, strict=True) if m]
        )
    ]
    got = {
        "text": rendered.text,
        "input_ids": rendered.input_ids,
        "loss_mask": rendered.loss_mask,
        "masked": spans,
    }
    if os.environ.get("EAGLE3_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(GOLDEN.read_text())


def test_loss_mask_covers_exactly_the_assistant_turns(tiny_tokenizer):
    rendered = render_conversation(tiny_tokenizer, CONVERSATION)
    masked = tiny_tokenizer.decode(
        [t for t, m in zip(rendered.input_ids, rendered.loss_mask, strict=True) if m]
    )
    assert masked == "2 + 3 = 5.<|im_end|>5 * 4 = 20.<|im_end|>"
    assert tiny_tokenizer.decode(rendered.input_ids) == rendered.text


def test_prompt_ids_are_a_prefix_of_the_conversation_ids(tiny_tokenizer):
    prompt = render_prompt(tiny_tokenizer, CONVERSATION[:4])
    full = render_conversation(tiny_tokenizer, CONVERSATION).input_ids
    assert full[: len(prompt)] == prompt
    assert tiny_tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")


def test_prompt_ending_with_an_assistant_turn_is_refused(tiny_tokenizer):
    with pytest.raises(TemplateError, match="does not end with an assistant turn"):
        render_prompt(tiny_tokenizer, CONVERSATION)
