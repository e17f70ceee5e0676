"""The one renderer on a thinking, tool-calling template (the thinking world's, shaped like
Kimi-K2.5's): the template's own rule for earlier turns, the thinking switch, and assistant spans
found in a prompt whose history the template rewrote."""

from __future__ import annotations

import pytest

from eagle3.data.template import (
    ChatOptions,
    TemplateError,
    prompt_char_spans,
    render_conversation,
    render_text,
    template_messages,
)
from eagle3.worlds.agentic import TOOLS

WEATHER = [TOOLS["get_weather"]]


def _call(k: int, city: str) -> dict[str, str]:
    return {
        "id": f"functions.get_weather:{k}",
        "name": "get_weather",
        "arguments": f'{{"city": "{city}"}}',
    }


def _section(k: int, city: str) -> str:
    return (
        f"<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:{k}<|tool_call_argument_begin|>"
        f'{{"city": "{city}"}}<|tool_call_end|><|tool_calls_section_end|>'
    )


CALL = _call(0, "Oslo")
# Kimi-K2.5's rule: turns up to the last answer without calls are history (thinking dropped), the
# chain after it keeps its thinking. Rendering this turn by turn keeps turn 1's thinking; the last
# prompt drops it.
HISTORY = [
    {"role": "user", "content": "What is the weather in Oslo?"},
    {
        "role": "assistant",
        "reasoning_content": "I will call get_weather.",
        "content": "",
        "tool_calls": [CALL],
    },
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "Oslo: 3 C, windy"},
    {
        "role": "assistant",
        "reasoning_content": "The tool says 3 C.",
        "content": "It is 3 C and windy in Oslo.",
    },
    {"role": "user", "content": "And in Lima?"},
    {
        "role": "assistant",
        "reasoning_content": "Again get_weather.",
        "content": "",
        "tool_calls": [_call(1, "Lima")],
    },
    {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "Lima: 20 C, sunny"},
]
ON = ChatOptions(tools=WEATHER)


def _spans_text(text: str, spans: list[tuple[int, int]]) -> list[str]:
    return [text[a:b] for a, b in spans]


def test_the_template_drops_the_thinking_of_earlier_answers_and_keeps_the_tool_chain_in_flight(
    think_tokenizer,
):
    text = render_text(think_tokenizer, HISTORY, add_generation_prompt=True, options=ON)
    # the earlier chain: thinking dropped
    assert "<think></think>" + _section(0, "Oslo") + "<|im_end|>" in text
    assert "<think></think>It is 3 C and windy in Oslo.<|im_end|>" in text
    # the chain in flight
    assert "<think>Again get_weather.</think>" + _section(1, "Lima") + "<|im_end|>" in text
    assert "## Return of functions.get_weather:0\nOslo: 3 C, windy<|im_end|>" in text
    assert text.startswith("<|im_system|>tool_declare<|im_middle|>[{")
    assert text.endswith("<|im_assistant|>assistant<|im_middle|><think>")


def test_thinking_off_closes_the_block_in_the_generation_prompt_and_drops_every_reasoning(
    think_tokenizer,
):
    off = ChatOptions(tools=WEATHER, kwargs={"thinking": False})
    text = render_text(think_tokenizer, HISTORY, add_generation_prompt=True, options=off)
    assert text.endswith("<|im_assistant|>assistant<|im_middle|><think></think>")
    assert "Again get_weather." not in text and "<think></think>" + _section(1, "Lima") in text


def test_spans_of_a_rewritten_history_cover_what_each_turn_wrote_after_its_generation_prompt(
    think_tokenizer,
):
    with pytest.raises(TemplateError, match="prefix-stable"):
        render_conversation(think_tokenizer, HISTORY, ON)  # the template rewrote the first answer
    text, spans = prompt_char_spans(think_tokenizer, HISTORY, ON)
    assert text == render_text(think_tokenizer, HISTORY, add_generation_prompt=True, options=ON)
    assert _spans_text(text, spans) == [
        # thinking dropped by the template: the rest is the model's
        "</think>" + _section(0, "Oslo") + "<|im_end|>",
        "</think>It is 3 C and windy in Oslo.<|im_end|>",
        # kept whole, thinking included
        "Again get_weather.</think>" + _section(1, "Lima") + "<|im_end|>",
    ]


def test_spans_of_a_history_the_template_keeps_are_the_prefix_renderers(think_tokenizer):
    chain = HISTORY[:3]
    text, spans = prompt_char_spans(think_tokenizer, chain, ON)
    # the prefix renderer: no rewrite here
    rendered = render_conversation(think_tokenizer, chain, ON)
    assert text.startswith(rendered.text)
    masked = think_tokenizer.decode(
        [t for t, m in zip(rendered.input_ids, rendered.loss_mask, strict=True) if m]
    )
    expected = "I will call get_weather.</think>" + _section(0, "Oslo") + "<|im_end|>"
    assert masked == "".join(_spans_text(text, spans)) == expected


def test_openai_shaped_calls_pass_to_the_template_as_they_are():
    openai = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [openai], "reasoning_content": None}
    ]
    assert template_messages(messages) == [
        {"role": "assistant", "content": "", "tool_calls": [openai]}
    ]
    ours = [{"role": "assistant", "content": "", "tool_calls": [CALL]}]
    function = template_messages(ours)[0]["tool_calls"][0]["function"]
    assert function == {"name": "get_weather", "arguments": CALL["arguments"]}
