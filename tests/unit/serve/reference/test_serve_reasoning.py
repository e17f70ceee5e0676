"""The reference server's chat completions for a thinking, tool-calling target
(``--reasoning-parser``), as SGLang 0.5.23 answers them: the thinking split off into
``reasoning_content``, tools and ``chat_template_kwargs`` reaching the chat template, assistant
calls' JSON-text arguments parsed for it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from eagle3.data.template import ChatOptions, render_prompt, template_messages
from eagle3.serve.launch import reference_server
from eagle3.worlds.agentic import AgenticFactory


@pytest.fixture(scope="module")
def server(think_world):
    args = ["--num-threads", "1", "--reasoning-parser", "kimi_k2"]
    with reference_server(think_world.model_dir, extra_args=args) as srv:
        yield srv


@pytest.fixture(scope="module")
def weather():
    conv = AgenticFactory(31).make("weather")
    return conv.messages, conv.tools


def _chat(url: str, messages: list[dict[str, Any]], tools: Any, **extra: Any) -> httpx.Response:
    body = {
        "model": "t",
        "messages": template_messages(messages),
        "tools": tools,
        "max_tokens": 96,
        "temperature": 0.0,
    } | extra
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def _generate_text(url: str, ids: list[int]) -> str:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 96, "temperature": 0.0}}
    return httpx.post(f"{url}/generate", json=body, timeout=120).json()["text"]


def test_the_thinking_comes_back_apart_in_reasoning_content(server, weather, think_world):
    from transformers import AutoTokenizer

    messages, tools = weather
    reply = _chat(server.url, messages[:1], tools).json()["choices"][0]["message"]
    assert reply["reasoning_content"] and "</think>" not in reply["content"]
    tok = AutoTokenizer.from_pretrained(think_world.model_dir)
    raw = _generate_text(server.url, render_prompt(tok, messages[:1], ChatOptions(tools=tools)))
    # one generation, split at </think>
    assert raw == reply["reasoning_content"] + "</think>" + reply["content"]
    assert "<|tool_calls_section_begin|>" in reply["content"], "the target did not call its tool"


def test_without_separate_reasoning_the_text_is_as_generated(server, weather):
    messages, tools = weather
    reply = _chat(server.url, messages[:1], tools, separate_reasoning=False).json()["choices"][0][
        "message"
    ]
    assert "</think>" in reply["content"] and "reasoning_content" not in reply


def test_thinking_off_through_chat_template_kwargs_gives_an_answer_without_reasoning(
    server, weather
):
    messages, tools = weather
    off = {"chat_template_kwargs": {"thinking": False}}
    reply = _chat(server.url, messages[:1], tools, **off).json()["choices"][0]["message"]
    assert reply["reasoning_content"] is None and "</think>" not in reply["content"]


def test_a_history_with_calls_and_results_is_rendered_and_bad_arguments_are_refused(
    server, weather
):
    messages, tools = weather
    # user, call, result: the next turn
    assert _chat(server.url, messages[:3], tools).status_code == 200
    broken = json.loads(json.dumps(messages[:3]))
    broken[1]["tool_calls"][0]["arguments"] = '{"city": '
    response = _chat(server.url, broken, tools)
    assert (
        response.status_code == 400 and "must be valid JSON" in response.json()["error"]["message"]
    )
