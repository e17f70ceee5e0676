"""Prompt sets from local JSONL and through the Hub code path (a local dataset dir), rendered
once."""

from __future__ import annotations

import json

import pytest

from eagle3.gate.prompts import load_gate_prompts, load_prompt_set


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_local_jsonl_set_keeps_ids_and_order_and_honours_the_limit(tmp_path):
    path = _jsonl(
        tmp_path / "chat.jsonl", [{"id": f"c{i}", "prompt": f"question {i}"} for i in range(5)]
    )
    prompts = load_prompt_set("chat", str(path), limit=3)
    assert [(p.set_name, p.prompt_id, p.prompt) for p in prompts] == [
        ("chat", "c0", "question 0"),
        ("chat", "c1", "question 1"),
        ("chat", "c2", "question 2"),
    ]


def test_hub_source_goes_through_datasets_and_finds_the_prompt_column(tmp_path):
    _jsonl(
        tmp_path / "gsm" / "test.jsonl",
        [{"question": f"what is {i}+1?", "answer": str(i + 1)} for i in range(3)],
    )
    prompts = load_prompt_set("math", f"hub:{tmp_path / 'gsm'}")
    assert [p.prompt for p in prompts] == [f"what is {i}+1?" for i in range(3)]
    chosen = load_prompt_set("math", f"hub:{tmp_path / 'gsm'}?column=answer", limit=2)
    assert [p.prompt for p in chosen] == ["1", "2"]


def test_missing_file_names_the_config_key(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"gate\.prompt_sets"):
        load_prompt_set("chat", str(tmp_path / "nope.jsonl"))


def test_gate_prompts_are_rendered_with_the_chat_template(tmp_path):
    class Tok:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt, tools=None):
            assert add_generation_prompt and not tokenize and tools is None
            return "<u>" + messages[0]["content"] + "</u><a>"

        def __call__(self, text, add_special_tokens, return_offsets_mapping):
            return {"input_ids": [ord(ch) for ch in text], "offset_mapping": []}

    sets = {
        "b": str(_jsonl(tmp_path / "b.jsonl", [{"id": "b0", "prompt": "hi"}])),
        "a": str(
            _jsonl(
                tmp_path / "a.jsonl", [{"id": "a0", "prompt": "yo"}, {"id": "a1", "prompt": "x"}]
            )
        ),
    }
    prompts = load_gate_prompts(sets, Tok(), per_set=1)
    assert [p.prompt_id for p in prompts] == ["a0", "b0"]
    assert prompts[1].input_ids == tuple(ord(ch) for ch in "<u>hi</u><a>")


def test_a_tool_use_row_is_rendered_with_its_tools_and_the_conversation_to_continue(
    tmp_path, tiny_tokenizer
):
    """A tool-set row may carry the tools and the messages up to a tool result; both reach the chat
    template."""
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Let me look."},
        {"role": "user", "content": "Thanks, and now?"},
    ]
    rows = [
        {"id": "t0", "prompt": "Weather in Oslo?", "tools": tools, "messages": messages},
        {"id": "t1", "prompt": "Weather in Lima?"},
    ]
    prompts = load_gate_prompts(
        {"tools": str(_jsonl(tmp_path / "tools.jsonl", rows))}, tiny_tokenizer, per_set=2
    )
    assert prompts[0].tools == tuple(tools) and prompts[0].messages == tuple(messages)
    assert tiny_tokenizer.decode(prompts[0].input_ids).count("<|im_start|>user") == 2
    assert tiny_tokenizer.decode(prompts[1].input_ids).endswith(
        "Weather in Lima?<|im_end|>\n<|im_start|>assistant\n"
    )
