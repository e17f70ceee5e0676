"""The thinking world's sample datasets, in the layouts agentic data ships in, with planted bad
rows.

Design choices:
- Four sources: ``openai_tools.jsonl`` (OpenAI messages: ``tool_calls`` with JSON-text arguments,
  ``tool`` results, some ``reasoning_content``, a ``tools`` list), ``sharegpt_tools.json`` (ShareGPT
  with function calls, LLaMA-Factory's layout: ``function_call`` / ``observation`` turns,
  ``system``, ``tools`` as JSON text), ``coderforge.parquet`` and ``swe_agent.parquet`` (the
  catalog's agentic-coding datasets as they are on the Hub: CoderForge-Preview's JSON-text
  ``messages``/``tools`` with a per-row license; nebius SWE-agent-trajectories' ``trajectory``
  structs with system/user/ai turns and commands written as text).
- Bad rows sit at seeded positions and are listed in ``bad_rows.json`` (``{adapter: [{"row",
  "reason", "detail"}]}``) as the tiny world lists its own: each tool-call defect the normalizer
  must catch is planted at least once (arguments that are not JSON, a result answering no call, a
  call left unanswered, an observation with no call, ``tool_calls`` of the wrong type), with the
  plain ones (duplicate, bad encoding, unknown role, empty, ...).
- Bench sets: ``think`` (chat, math and code prompts: the target thinks before it answers) and
  ``tools`` (tool-use prompts with their tools; half stop after the first tool result, so the set
  also measures the turn after a result). Drawn first from the same factory, so no training row
  repeats a bench prompt, and their tool arguments from held-out pools (``HELD_OUT_POOLS``), so none
  shares its city, numbers or function.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from eagle3.data.template import template_messages
from eagle3.worlds.agentic import KINDS, TOOL_KINDS, Agentic, AgenticFactory
from eagle3.worlds.samples import (
    BAD_ROWS_FILE,
    BAD_TEXT,
    MANIFEST_FILE,
    file_stats,
    write_jsonl,
    write_rows,
)

AGENTIC_VERSION = "1"
ADAPTERS = ("openai_tools", "sharegpt_tools", "coderforge", "swe_agent")
FILE_NAMES = {
    "openai_tools": "openai_tools.jsonl",
    "sharegpt_tools": "sharegpt_tools.json",
    "coderforge": "coderforge.parquet",
    "swe_agent": "swe_agent.parquet",
}
KINDS_BY_ADAPTER = {
    "openai_tools": KINDS,
    "sharegpt_tools": ("weather", "calc", "chat", "math"),
    "coderforge": ("coding",),
    "swe_agent": ("coding",),
}
# code prompts share their templates' 13-grams
BENCH_SETS = {"think": ("chat", "math"), "tools": TOOL_KINDS}
BENCH_PER_SET = 16
_SYSTEM = "You are a careful assistant. Use the tools when they help."
_AGENT_SYSTEM = "You are a coding agent. Run the tests, read the code, fix it and report."
Row = dict[str, Any]


def _openai(conv: Agentic, i: int) -> Row:
    messages = template_messages(conv.messages)
    for m in messages:
        if m.get("tool_calls") and not m.get("content"):
            m["content"] = None  # OpenAI writes no text for a turn that only calls
        if i % 2 and m["role"] == "assistant":
            m.pop("reasoning_content", None)  # half the rows carry the thinking, half do not
    return {
        "id": f"oa-{i:04d}",
        "messages": messages,
        **({"tools": conv.tools} if conv.tools else {}),
    }


def _sharegpt(conv: Agentic, i: int) -> Row:
    system = next((m["content"] for m in conv.messages if m["role"] == "system"), _SYSTEM)
    turns = []
    for m in conv.messages:
        if m.get("tool_calls"):
            calls = [
                {"name": c["name"], "arguments": json.loads(c["arguments"])}
                for c in m["tool_calls"]
            ]
            turns.append(
                {
                    "from": "function_call",
                    "value": json.dumps(calls[0] if len(calls) == 1 else calls),
                }
            )
        elif m["role"] != "system":
            role = {"user": "human", "assistant": "gpt", "tool": "observation"}[m["role"]]
            turns.append({"from": role, "value": m["content"]})
    return {
        "conversations": turns,
        "system": system,
        "tools": json.dumps(conv.tools) if conv.tools else "",
    }


def _coderforge(conv: Agentic, i: int) -> Row:
    messages = [{"role": "system", "content": _AGENT_SYSTEM}, *template_messages(conv.messages)]
    calls = [c for m in conv.messages for c in m.get("tool_calls") or []]
    ids = {c["id"]: f"call_{i:04d}_{k}" for k, c in enumerate(calls)}
    for m in messages:
        m.pop("reasoning_content", None)
        for call in m.get("tool_calls") or []:
            call["id"] = ids[call["id"]]
        if m["role"] == "tool":
            m["tool_call_id"] = ids[m["tool_call_id"]]
    return {
        "trajectory_id": f"tiny__agent-{i}_run1",
        "finish_reason": "tool_calls",
        "image": "tiny/sandbox:1",
        "messages": json.dumps(messages),
        "reward": 1.0,
        "tools": json.dumps(conv.tools),
        "license": "Apache-2.0",
    }


_COMMANDS = {
    "run_tests": "pytest {path}",
    "read_file": "cat {path}",
    "write_file": "cat > {path} <<EOF\n{content}EOF",
}


def _swe_agent(conv: Agentic, i: int) -> Row:
    def turn(role: str, text: str) -> Row:
        prompt = _AGENT_SYSTEM if role == "system" else None
        return {
            "cutoff_date": "01.01.2024",
            "mask": role == "ai",
            "role": role,
            "system_prompt": prompt,
            "text": text,
        }

    trajectory = [turn("system", _AGENT_SYSTEM)]
    for m in conv.messages:
        if m["role"] == "assistant":
            calls = m.get("tool_calls") or []
            command = (
                _COMMANDS[calls[0]["name"]].format(**json.loads(calls[0]["arguments"]))
                if calls
                else "submit"
            )
            trajectory.append(
                turn("ai", f"DISCUSSION\n{m['reasoning_content']}\n\n```\n{command}\n```")
            )
        else:
            trajectory.append(turn("user", m["content"]))
    return {
        "instance_id": f"tiny__agent-{i}",
        "model_name": "tiny-agent",
        "target": True,
        "trajectory": trajectory,
        "exit_status": "submitted",
        "generated_patch": "",
        "eval_logs": "",
    }


_TO_ROW: dict[str, Callable[[Agentic, int], Row]] = {
    "openai_tools": _openai,
    "sharegpt_tools": _sharegpt,
    "coderforge": _coderforge,
    "swe_agent": _swe_agent,
}


def _first_call(messages: list[Row]) -> int:
    return next(k for k, m in enumerate(messages) if m.get("tool_calls"))


def _openai_breakers() -> list[tuple[str, str, Callable[[Row], Row | str]]]:
    def args(row: Row) -> Row:
        row["messages"][_first_call(row["messages"])]["tool_calls"][0]["function"]["arguments"] = (
            '{"city": "Oslo"'
        )
        return row

    def orphan(row: Row) -> Row:
        next(m for m in row["messages"] if m["role"] == "tool")["tool_call_id"] = "call_missing"
        return row

    def calls_string(row: Row) -> Row:
        row["messages"][_first_call(row["messages"])]["tool_calls"] = "get_weather"
        return row

    def tool_after_user(row: Row) -> Row:
        row["messages"].pop(_first_call(row["messages"]))
        return row

    def bad_text(row: Row) -> Row:
        row["messages"][0]["content"] = (
            row["messages"][0]["content"][:10] + BAD_TEXT + row["messages"][0]["content"]
        )
        return row

    return [
        ("bad_tool_call", "arguments_not_json", args),
        ("bad_tool_call", "result_answers_no_call", orphan),
        ("malformed", "tool_calls_is_string", calls_string),
        ("not_alternating", "tool_result_after_user", tool_after_user),
        ("malformed", "truncated_json_line", lambda row: json.dumps(row)[:50]),
        ("bad_encoding", "bad_encoding", bad_text),
    ]


def _sharegpt_breakers() -> list[tuple[str, str, Callable[[Row], Row | str]]]:
    def call_not_json(row: Row) -> Row:
        next(t for t in row["conversations"] if t["from"] == "function_call")["value"] = (
            "get_weather(city=Oslo)"
        )
        return row

    def observation_first(row: Row) -> Row:
        row["conversations"] = [t for t in row["conversations"] if t["from"] != "function_call"]
        return row

    def role(row: Row) -> Row:
        row["conversations"].insert(0, {"from": "planner", "value": "First call the weather tool."})
        return row

    return [
        ("bad_tool_call", "function_call_not_json", call_not_json),
        ("not_alternating", "observation_without_call", observation_first),
        ("malformed", "tools_is_number", lambda row: {**row, "tools": 7}),
        ("unknown_role", "unknown_role", role),
        ("empty", "empty", lambda row: {**row, "conversations": []}),
    ]


def _coderforge_breakers() -> list[tuple[str, str, Callable[[Row], Row | str]]]:
    def edit(change: Callable[[list[Row]], list[Row]]) -> Callable[[Row], Row]:
        return lambda row: {**row, "messages": json.dumps(change(json.loads(row["messages"])))}

    def orphan(messages: list[Row]) -> list[Row]:
        next(m for m in messages if m["role"] == "tool")["tool_call_id"] = "call_missing"
        return messages

    def unanswered(messages: list[Row]) -> list[Row]:
        return [
            *messages[: _first_call(messages) + 1],
            {"role": "user", "content": "Stop, just tell me the plan."},
        ]

    return [
        (
            "malformed",
            "messages_json_truncated",
            lambda row: {**row, "messages": row["messages"][:60]},
        ),
        ("bad_tool_call", "result_answers_no_call", edit(orphan)),
        ("bad_tool_call", "call_unanswered", edit(unanswered)),
        ("no_user_turn", "no_user_turn", edit(lambda ms: [m for m in ms if m["role"] != "user"])),
    ]


def _swe_agent_breakers() -> list[tuple[str, str, Callable[[Row], Row | str]]]:
    def narrator(row: Row) -> Row:
        row["trajectory"][1]["role"] = "narrator"
        return row

    def twice(row: Row) -> Row:
        row["trajectory"].insert(2, dict(row["trajectory"][2]))
        return row

    return [
        ("unknown_role", "unknown_role", narrator),
        ("empty", "empty", lambda row: {**row, "trajectory": []}),
        ("not_alternating", "two_ai_turns", twice),
    ]


BREAKERS = {
    "openai_tools": _openai_breakers,
    "sharegpt_tools": _sharegpt_breakers,
    "coderforge": _coderforge_breakers,
    "swe_agent": _swe_agent_breakers,
}


def _build(adapter: str, n: int, factory: AgenticFactory) -> tuple[list[Row | str], list[Row]]:
    """Rows of one file and their bad-row records: good rows, the planted breakages and one
    duplicate."""
    rng = factory.rng
    breakers = BREAKERS[adapter]()
    spots = sorted(rng.sample(range(4, n), len(breakers) + 1))
    plan = dict(zip(spots, [*breakers, ("duplicate", "", None)], strict=True))
    rows: list[Row | str] = []
    records = []
    for i in range(n):
        reason, detail, breaker = plan.get(i, (None, "", None))
        if reason == "duplicate":
            source = rng.randrange(4)
            rows.append(copy.deepcopy(rows[source]))
            records.append({"row": i, "reason": reason, "detail": f"copy of row {source}"})
            continue
        kind = rng.choice(KINDS_BY_ADAPTER[adapter] if breaker is None else _tool_kinds(adapter))
        row = _TO_ROW[adapter](factory.make(kind), i)
        rows.append(row if breaker is None else breaker(copy.deepcopy(row)))
        if reason:
            records.append({"row": i, "reason": reason, "detail": detail})
    return rows, records


def _tool_kinds(adapter: str) -> tuple[str, ...]:
    """Kinds whose rows have a tool call to break."""
    return tuple(k for k in KINDS_BY_ADAPTER[adapter] if k in TOOL_KINDS)


_STEP = pa.struct(
    [
        ("cutoff_date", pa.string()),
        ("mask", pa.bool_()),
        ("role", pa.string()),
        ("system_prompt", pa.string()),
        ("text", pa.string()),
    ]
)
_CODERFORGE = ("trajectory_id", "finish_reason", "image", "messages", "reward", "tools", "license")
_SWE_AGENT = (
    "instance_id",
    "model_name",
    "target",
    "trajectory",
    "exit_status",
    "generated_patch",
    "eval_logs",
)
_TYPES = {"reward": pa.float64(), "target": pa.bool_(), "trajectory": pa.list_(_STEP)}
_PARQUET = {
    name: pa.schema([(c, _TYPES.get(c, pa.string())) for c in columns])
    for name, columns in (("coderforge", _CODERFORGE), ("swe_agent", _SWE_AGENT))
}


def _bench_row(name: str, j: int, conv: Agentic) -> Row:
    row: Row = {"id": f"{name}-{j:03d}", "prompt": conv.messages[0]["content"]}
    if conv.tools:
        row["tools"] = conv.tools
        if j % 2:  # up to the first tool result: the turn after a result is measured too
            row["messages"] = template_messages(conv.messages[: _first_call(conv.messages) + 2])
    return row


def _write_bench(bench_dir: Path, factory: AgenticFactory) -> None:
    bench_dir.mkdir(parents=True, exist_ok=True)
    for name, kinds in BENCH_SETS.items():
        rows = [
            _bench_row(name, j, factory.make(kinds[j % len(kinds)], held_out=True))
            for j in range(BENCH_PER_SET)
        ]
        write_jsonl(bench_dir / f"{name}.jsonl", rows)


def write_agentic_samples(
    out_dir: Path, *, seed: int = 0, rows_per_source: int = 120
) -> dict[str, Path]:
    """Every agentic source file, the bench sets, ``bad_rows.json`` and ``samples.json``; returns
    adapter -> path and ``"bench"`` -> the bench directory. Same seed, same bytes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    factory = AgenticFactory(seed)
    _write_bench(out_dir / "bench", factory)
    paths, bad_rows, files = {}, {}, {}
    for adapter in ADAPTERS:
        rows, bad_rows[adapter] = _build(adapter, rows_per_source, factory)
        paths[adapter] = out_dir / FILE_NAMES[adapter]
        write_rows(paths[adapter], rows, _PARQUET.get(adapter))
        counts = {"rows": len(rows), "bad_rows": len(bad_rows[adapter])}
        files[adapter] = {"path": FILE_NAMES[adapter], **counts, **file_stats(paths[adapter])}
    (out_dir / BAD_ROWS_FILE).write_text(json.dumps(bad_rows, indent=1) + "\n")
    manifest = {
        "version": AGENTIC_VERSION,
        "seed": seed,
        "rows_per_source": rows_per_source,
        "files": files,
        "bench": {
            name: {"path": f"bench/{name}.jsonl", "rows": BENCH_PER_SET} for name in BENCH_SETS
        },
        "bad_rows": BAD_ROWS_FILE,
    }
    (out_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return paths | {"bench": out_dir / "bench"}
