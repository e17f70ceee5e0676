"""The malformed-input corpus, tool-call cases: every way a tool-calling row arrives (OpenAI
messages, the legacy ``function_call``, ShareGPT with function calls, JSON-text turn lists and
tools) is either kept, its calls structured and tied to their results, or quarantined with its
reason. One JSONL file holds every case; the prompts stage must finish and balance its books."""

from __future__ import annotations

import json
from typing import Any

import pyarrow.parquet as pq
import pytest
from data_stage_helpers import make_config, normalize

from eagle3.rundir.runroot import Manifest

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
]
KEPT = None


def _call(
    name: str = "get_weather", args: Any = '{"city": "Oslo"}', cid: str | None = "c1"
) -> dict[str, Any]:
    call = {"type": "function", "function": {"name": name, "arguments": args}}
    return call | ({"id": cid} if cid is not None else {})


def _row(*messages: dict[str, Any], tools: Any = TOOLS, tag: str) -> dict[str, Any]:
    """A conversation; ``tag`` makes its prompt unique so exact dedup never merges two cases."""
    user = {"role": "user", "content": f"What is the weather in Oslo? ({tag})"}
    return {"messages": [user, *messages], **({"tools": tools} if tools is not None else {})}


def _asks(*calls: dict[str, Any], content: Any = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def _result(cid: str | None = "c1", content: str = "Oslo: 3 C") -> dict[str, Any]:
    return {
        "role": "tool",
        "content": content,
        **({"tool_call_id": cid} if cid is not None else {}),
    }


ANSWER = {"role": "assistant", "content": "It is 3 C in Oslo."}
LATER = {"role": "user", "content": "Thanks!"}

# case -> (row, KEPT or the quarantine reason)
CASES: dict[str, tuple[Any, str | None]] = {
    "openai_call_and_result": (_row(_asks(_call()), _result(), ANSWER, tag="a"), KEPT),
    "parallel_calls": (
        _row(
            _asks(_call(cid="c1"), _call(cid="c2")), _result("c1"), _result("c2"), ANSWER, tag="b"
        ),
        KEPT,
    ),
    "results_without_ids_answer_in_order": (
        _row(_asks(_call()), _result(None), ANSWER, tag="c"),
        KEPT,
    ),
    "calls_without_ids_get_kimis": (
        _row(_asks(_call(cid=None)), _result(None), ANSWER, tag="d"),
        KEPT,
    ),
    "arguments_as_an_object": (
        _row(_asks(_call(args={"city": "Oslo"})), _result(), ANSWER, tag="e"),
        KEPT,
    ),
    "content_text_beside_calls": (
        _row(_asks(_call(), content="Let me check."), _result(), ANSWER, tag="f"),
        KEPT,
    ),
    "legacy_function_call_and_function_role": (
        _row(
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "get_weather", "arguments": "{}"},
            },
            {"role": "function", "name": "get_weather", "content": "Oslo: 3 C"},
            ANSWER,
            tag="g",
        ),
        KEPT,
    ),
    "trailing_call_without_result": (_row(_asks(_call()), tag="h"), KEPT),
    "messages_as_json_text": (
        {
            "messages": json.dumps(_row(_asks(_call()), _result(), ANSWER, tag="i")["messages"]),
            "tools": json.dumps(TOOLS),
        },
        KEPT,
    ),
    "tools_as_a_list_of_json_texts": (
        _row(_asks(_call()), _result(), ANSWER, tools=[json.dumps(TOOLS[0])], tag="j"),
        KEPT,
    ),
    "calls_written_as_text_then_a_result": (
        _row(
            {"role": "assistant", "content": "<call>get_weather(Oslo)</call>"},
            _result(None),
            ANSWER,
            tools=None,
            tag="k",
        ),
        KEPT,
    ),
    "sharegpt_function_call_and_observation": (
        {
            "conversations": [
                {"from": "human", "value": "Weather in Oslo? (l)"},
                {
                    "from": "function_call",
                    "value": json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}}),
                },
                {"from": "observation", "value": "Oslo: 3 C"},
                {"from": "gpt", "value": "3 C."},
            ],
            "tools": json.dumps(TOOLS),
        },
        KEPT,
    ),
    "arguments_not_json": (
        _row(_asks(_call(args='{"city": "Oslo"')), _result(), tag="m"),
        "bad_tool_call",
    ),
    "arguments_a_json_list": (
        _row(_asks(_call(args='["Oslo"]')), _result(), tag="n"),
        "bad_tool_call",
    ),
    "arguments_a_number": (_row(_asks(_call(args=7)), _result(), tag="o"), "bad_tool_call"),
    "result_answers_no_call": (
        _row(_asks(_call()), _result("c9"), ANSWER, tag="p"),
        "bad_tool_call",
    ),
    "more_results_than_calls": (
        _row(_asks(_call()), _result("c1"), _result(None), ANSWER, tag="q"),
        "bad_tool_call",
    ),
    "two_calls_one_id": (
        _row(_asks(_call(), _call()), _result(), _result(), tag="r"),
        "bad_tool_call",
    ),
    "call_unanswered_before_the_next_user_turn": (
        _row(_asks(_call()), LATER, tag="s"),
        "bad_tool_call",
    ),
    "function_call_turn_not_json": (
        {
            "conversations": [
                {"from": "human", "value": "Weather? (t)"},
                {"from": "function_call", "value": "get_weather(city=Oslo)"},
                {"from": "observation", "value": "3 C"},
            ]
        },
        "bad_tool_call",
    ),
    "tool_calls_a_string": (
        _row({"role": "assistant", "content": None, "tool_calls": "get_weather"}, tag="u"),
        "malformed",
    ),
    "call_without_a_name": (
        _row(_asks({"id": "c1", "function": {"arguments": "{}"}}), _result(), tag="v"),
        "malformed",
    ),
    "call_a_number": (_row(_asks(5), _result(), tag="w"), "malformed"),
    "tools_an_object": (
        _row(_asks(_call()), _result(), tools={"get_weather": {}}, tag="x"),
        "malformed",
    ),
    "tools_broken_json_text": (_row(_asks(_call()), _result(), tools="[{", tag="y"), "malformed"),
    "messages_json_text_cut_short": (
        {"messages": '[{"role": "user", "content": "Weath'},
        "malformed",
    ),
    "tool_result_right_after_the_user": (_row(_result(), ANSWER, tag="z"), "not_alternating"),
    "empty_tool_result": (_row(_asks(_call()), _result(content="  "), ANSWER, tag="aa"), "empty"),
}


@pytest.fixture(scope="module")
def normalized(
    data_world, tmp_path_factory
) -> tuple[dict[str, Any], dict[int, str], list[dict[str, Any]]]:
    """The prompts stage over the corpus: (the source's counts, row -> quarantine reason, kept
    rows)."""
    tmp = tmp_path_factory.mktemp("tool-calls")
    path = tmp / "tool_calls.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row, _ in CASES.values()))
    out = normalize(
        make_config(
            data_world,
            tmp / "run",
            ["gate.prompt_sets={}", f"sources=[{{adapter: jsonl, path: '{path}'}}]"],
        )
    )
    stats = Manifest.read(out).stats["sources"]["jsonl"]
    quarantine = {
        int(r["source_row"]): r["reason"]
        for r in pq.read_table(out / "quarantine.parquet").to_pylist()
    }
    kept = [r for p in sorted(out.glob("shard-*.parquet")) for r in pq.read_table(p).to_pylist()]
    return stats, quarantine, kept


def test_every_tool_call_case_is_kept_or_quarantined_with_its_reason(normalized):
    stats, quarantine, kept = normalized
    assert stats["in"] == len(CASES) == stats["kept"] + sum(stats["quarantined"].values())
    outcome = {name: quarantine.get(i, KEPT) for i, name in enumerate(CASES)}
    assert outcome == {name: expected for name, (_row, expected) in CASES.items()}
    assert len(kept) == sum(expected is KEPT for _row, expected in CASES.values())


def test_kept_calls_are_structured_named_and_tied_to_their_results(normalized):
    _stats, _quarantine, kept = normalized
    by_row = {int(r["source_row"]): r for r in kept}
    names = list(CASES)
    parallel = by_row[names.index("parallel_calls")]
    calls = parallel["messages"][1]["tool_calls"]
    assert [c["id"] for c in calls] == ["c1", "c2"] and calls[0]["name"] == "get_weather"
    assert [m["tool_call_id"] for m in parallel["messages"][2:4]] == ["c1", "c2"]
    kimi = by_row[names.index("calls_without_ids_get_kimis")]["messages"]
    assert kimi[1]["tool_calls"][0]["id"] == kimi[2]["tool_call_id"] == "functions.get_weather:0"
    assert by_row[names.index("arguments_as_an_object")]["messages"][1]["tool_calls"][0][
        "arguments"
    ] == ('{"city": "Oslo"}')
    sharegpt = by_row[names.index("sharegpt_function_call_and_observation")]
    assert [m["role"] for m in sharegpt["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert sharegpt["messages"][2]["tool_call_id"] == "functions.get_weather:0"
    assert json.loads(sharegpt["tools"]) == TOOLS
    free = by_row[names.index("calls_written_as_text_then_a_result")]
    assert free["tools"] is None and free["messages"][2]["tool_call_id"] is None
