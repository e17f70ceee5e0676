"""Regen on the thinking world: a target that thinks and calls tools, served by the reference
server.

What is checked, token by token: the row's prompt is the template's own rendering of the regenerated
history (its earlier answers' thinking dropped by the template's rule, the tool chain in flight kept
whole), the output is the server's ids as received (thinking included), and the loss mask covers
exactly what the target wrote after each generation prompt: nothing of the system text, the user
turns or the replayed tool results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from eagle3.data.dialect import reasoning_format, tool_call_format
from eagle3.data.template import ChatOptions, render_prompt
from eagle3.regen.plan import regen_fingerprint, sampling_fields
from eagle3.regen.stage import RegenStage
from eagle3.rundir.runroot import Manifest
from eagle3.serve.launch import reference_server
from eagle3.stage import run_stage

CALLS = tool_call_format("kimi_k2")
THINK_END = reasoning_format("kimi_k2").think_end
EOS = "<|im_end|>"


@pytest.fixture(scope="module")
def think_model(think_world) -> Path:
    return Path(think_world.model_dir)


@pytest.fixture(scope="module")
def server(think_model: Path):
    args = ["--num-threads", "1", "--max-running-requests", "8", "--reasoning-parser", "kimi_k2"]
    with reference_server(think_model, extra_args=args) as srv:
        yield srv


@pytest.fixture(scope="module")
def source(regen_helpers) -> dict[str, dict[str, Any]]:
    return {row["sample_id"]: row for row in regen_helpers.agentic_rows()}


def config(helpers, root: Path, model: Path, servers: list[str], **regen: Any):
    """The tiny_think recipe's regen settings: Kimi's parsers, thinking on, room for a tool call."""
    settings = {
        "reasoning_parser": "kimi_k2",
        "tool_call_parser": "kimi_k2",
        "thinking": True,
        "max_new_tokens": 96,
    } | regen
    return helpers.config(root, model, servers, context_length=1024, **settings)


def _history_end(history: list[dict[str, Any]]) -> int:
    """The template's rule: the last assistant turn without tool calls ends the history whose
    thinking is dropped."""
    return max(
        (j for j, m in enumerate(history) if m["role"] == "assistant" and not m["tool_calls"]),
        default=-1,
    )


def _written(message: dict[str, Any], *, thinking: bool) -> str:
    """What the target wrote after a generation prompt that the template shows for this turn."""
    head = (message["reasoning_content"] or "") if thinking else ""
    return head + THINK_END + message["content"] + CALLS.format(message["tool_calls"] or []) + EOS


def _masked_runs(tok: Any, ids: list[int], mask: list[int]) -> list[str]:
    runs, run = [], []
    for token, bit in zip(ids, mask, strict=True):
        if bit:
            run.append(token)
        elif run:
            runs.append(tok.decode(run))
            run = []
    return runs + ([tok.decode(run)] if run else [])


@pytest.fixture(scope="module")
def regenerated(
    tmp_path_factory, think_model, server, regen_helpers
) -> tuple[Any, list[dict[str, Any]], Path]:
    root = tmp_path_factory.mktemp("think-regen")
    prompts = regen_helpers.write_prompts(root, [regen_helpers.agentic_rows()])
    cfg = config(regen_helpers, root, think_model, [server.url])
    summary = run_stage(RegenStage(), cfg, prompts_dir=prompts).summary
    assert summary["done"] and summary["failed_shards"] == []
    out = Path(summary["regen_dir"])
    return cfg, pq.read_table(out / "shard-00000.parquet").to_pylist(), out


def test_a_multi_turn_tool_conversation_is_regenerated_end_to_end(regenerated):
    _cfg, rows, out = regenerated
    weather = [r for r in rows if r["sample_id"].startswith("weather")]
    assert all(r["status"] == "ok" for r in rows)
    full = [r for r in weather if not json.loads(r["meta"])["stopped"]]
    assert full, (
        "the target made no tool call where the source answered one in any weather conversation"
    )
    for row in full:
        roles = [m["role"] for m in row["messages"]]
        assert roles == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        meta = json.loads(row["meta"])
        assert (meta["turns"], meta["tool_results"], meta["history"]) == (4, 2, "template")
    assert Manifest.read(out).stats["history_rewritten"] >= len(full)


def test_tool_results_are_replayed_from_the_source_answering_the_targets_own_calls(
    regenerated, source
):
    _cfg, rows, _out = regenerated
    for row in rows:
        replayed = [m for m in row["messages"] if m["role"] == "tool"]
        original = [m for m in source[row["sample_id"]]["messages"] if m["role"] == "tool"]
        assert [m["content"] for m in replayed] == [m["content"] for m in original[: len(replayed)]]
        for k, message in enumerate(row["messages"]):
            if message["role"] == "tool":
                calls = row["messages"][k - 1]["tool_calls"] or row["messages"][k - 2]["tool_calls"]
                assert message["tool_call_id"] in [c["id"] for c in calls]


def _server_greedy(url: str, ids: list[int]) -> list[int]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 96, "temperature": 0.0}}
    return httpx.post(f"{url}/generate", json=body, timeout=300).json()["output_ids"]


def test_the_loss_mask_covers_exactly_what_the_target_wrote_thinking_included(
    regenerated, think_model, server, source
):
    _cfg, rows, _out = regenerated
    tok = AutoTokenizer.from_pretrained(think_model)
    for row in rows:
        history, last = row["messages"][:-1], row["messages"][-1]
        prompt, output = (
            row["input_ids"][: row["prompt_tokens"]],
            row["input_ids"][row["prompt_tokens"] :],
        )
        tools = source[row["sample_id"]]["tools"]
        options = ChatOptions(tools=json.loads(tools) if tools else None, kwargs={"thinking": True})
        # the template's own rendering, token for token
        assert prompt == render_prompt(tok, history, options)
        # the last turn as the target wrote it, as received
        assert output == _server_greedy(server.url, prompt)
        assert last["reasoning_content"] and tok.decode(output).startswith(
            last["reasoning_content"] + THINK_END
        )
        end = _history_end(history)
        expected = [
            _written(m, thinking=j > end) for j, m in enumerate(history) if m["role"] == "assistant"
        ]
        assert _masked_runs(tok, prompt, row["loss_mask"][: len(prompt)]) == expected
        assert all(row["loss_mask"][len(prompt) :]) and len(row["loss_mask"]) == len(
            row["input_ids"]
        )


def test_thinking_enters_the_fingerprint(regen_helpers, tmp_path, think_model):
    fps = {
        thinking: regen_fingerprint(
            "p", config(regen_helpers, tmp_path, think_model, [], thinking=thinking)
        )
        for thinking in (True, False, None)
    }
    assert len(set(fps.values())) == 3
    plain = sampling_fields(regen_helpers.config(tmp_path, think_model, []).regen)
    # plain fps unchanged
    assert not {"reasoning_parser", "tool_call_parser", "chat_template_kwargs"} & set(plain)


def test_the_openai_path_keeps_the_thinking_the_servers_reasoning_parser_split_off(
    regenerated, tmp_path, think_model, server, regen_helpers
):
    """The same conversations through /v1/chat/completions on a server with ``--reasoning-parser
    kimi_k2``: the thinking comes back in ``reasoning_content`` and is joined back, so the rows hold
    what /generate gave."""
    _cfg, generated, _out = regenerated
    prompts = regen_helpers.write_prompts(tmp_path, [regen_helpers.agentic_rows()])
    cfg = config(regen_helpers, tmp_path, think_model, [server.url], api="openai")
    summary = run_stage(RegenStage(), cfg, prompts_dir=prompts).summary
    rows = {
        r["sample_id"]: r
        for r in pq.read_table(Path(summary["regen_dir"]) / "shard-00000.parquet").to_pylist()
    }
    assert set(rows) == {r["sample_id"] for r in generated}
    for row in generated:
        via_openai = rows[row["sample_id"]]
        assert via_openai["messages"] == row["messages"]
        assert any(
            m["reasoning_content"] for m in via_openai["messages"] if m["role"] == "assistant"
        )
        if json.loads(row["meta"])["round_trip"]:
            assert (
                via_openai["input_ids"] == row["input_ids"]
                and via_openai["loss_mask"] == row["loss_mask"]
            )
