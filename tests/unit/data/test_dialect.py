"""Dialects of thinking, tool-calling targets: SGLang's reasoning split, its inverse, Kimi's
tool-call syntax."""

from __future__ import annotations

import pytest

from eagle3.config.regen import ReasoningParser, ToolCallParser
from eagle3.data.dialect import (
    REASONING_FORMATS,
    TOOL_CALL_FORMATS,
    DialectError,
    reasoning_format,
    tool_call_format,
)

KIMI = reasoning_format("kimi_k2")
CALLS = tool_call_format("kimi_k2")
SECTION = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>'
)


@pytest.mark.parametrize(
    ("text", "forced", "split"),
    [
        ("I should answer.</think>It is 4.", True, ("I should answer.", "It is 4.")),
        ("<think>I should answer.</think>It is 4.", False, ("I should answer.", "It is 4.")),
        ("It is 4.", False, (None, "It is 4.")),
        (
            "still thinking when the budget ran out",
            True,
            ("still thinking when the budget ran out", ""),
        ),
        # the tool section ends the thinking
        ("I call the tool." + SECTION, True, ("I call the tool.", SECTION)),
        ("</think>It is 4.", True, ("", "It is 4.")),
    ],
)
def test_split_is_sglangs_non_streaming_reasoning_parse(text, forced, split):
    assert KIMI.split(text, forced=forced) == split


@pytest.mark.parametrize(
    "text",
    [
        "I should answer.</think>It is 4.",
        "</think>It is 4.",
        "Let me call it.</think>" + SECTION,
        "</think>",
    ],
)
def test_join_rebuilds_what_a_finished_turn_wrote_from_the_servers_split(text):
    reasoning, content = KIMI.split(text, forced=True)
    served = reasoning or None  # SGLang returns reasoning_content null when the reasoning is empty
    assert KIMI.join(served, content, forced=True, finished=True) == text


def test_join_keeps_text_a_server_did_not_split_and_a_cut_short_thinking():
    assert KIMI.join(None, "I should answer.</think>It is 4.", forced=True, finished=True) == (
        "I should answer.</think>It is 4."
    )
    assert KIMI.join("cut short", "", forced=True, finished=False) == "cut short"
    assert KIMI.join(None, "It is 4.", forced=False, finished=True) == "It is 4."


def test_the_thinking_switch_is_on_unless_the_request_turns_it_off():
    assert KIMI.is_on({}) and KIMI.is_on({"thinking": True}) and not KIMI.is_on({"thinking": False})


def test_tool_calls_parse_into_structured_calls_and_format_back_to_the_same_text():
    two = SECTION.replace(
        "<|tool_calls_section_end|>",
        '<|tool_call_begin|>functions.calculator:1<|tool_call_argument_begin|>{"expression": "2 * 3"}'
        "<|tool_call_end|><|tool_calls_section_end|>",
    )
    content, calls = CALLS.parse("Checking." + two)
    assert content == "Checking."
    assert calls == [
        {"id": "functions.get_weather:0", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {
            "id": "functions.calculator:1",
            "name": "calculator",
            "arguments": '{"expression": "2 * 3"}',
        },
    ]
    assert content + CALLS.format(calls) == "Checking." + two
    assert CALLS.parse("no calls here") == ("no calls here", [])


def test_unknown_parsers_list_the_known_ones():
    with pytest.raises(DialectError, match="known: kimi_k2"):
        reasoning_format("qwen9")
    with pytest.raises(DialectError, match="known: kimi_k2"):
        tool_call_format("qwen9")


def test_the_configs_parser_names_are_the_registered_dialects():
    assert set(ReasoningParser.__args__) == set(REASONING_FORMATS)
    assert set(ToolCallParser.__args__) == set(TOOL_CALL_FORMATS)
