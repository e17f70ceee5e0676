"""Row converters: one raw dataset row (a dict) -> messages with roles system, user, assistant,
tool.

Each catalog entry names a row format (``eagle3.data.catalog``); ``convert_row`` dispatches on it.
Conversion only maps structure and roles; it raises ``RowError(reason)`` for rows it cannot read
(wrong types, missing keys, unknown roles). Content policy (empty turns, alternation, length,
encoding) is the normalizer's job, so every format is judged by the same rules.

Role names: human/user -> user; gpt/chatgpt/bing/bard/model/assistant/ai -> assistant; system;
tool/function/ ipython/observation -> tool; function_call (ShareGPT with function calls) -> an
assistant turn calling tools. Anything else is ``unknown_role``. Turn text is ``content``, ``value``
or ``text`` (SWE-agent trajectories); a turn list may be stored as JSON text (agentic datasets do).
Tool calls and the row's tool declarations are read into one shape by ``eagle3.data.toolcalls``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagle3.data.catalog import DatasetEntry
from eagle3.data.schema import MALFORMED, UNKNOWN_ROLE
from eagle3.data.toolcalls import ToolCallError, json_list, read_calls, read_tools

Message = dict[str, Any]

ROLE_MAP: dict[str, str] = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "ai": "assistant",
    "function_call": "assistant",
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",
    "observation": "tool",
}
TURN_LIST_KEYS = ("messages", "conversations", "conversation")
TEXT_KEYS = ("content", "value", "text")
META_KEYS = ("id", "model", "category", "language", "source", "license")  # a row's own license wins


class RowError(ValueError):
    """A row that cannot be converted; ``reason`` is a quarantine reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass
class Converted:
    messages: list[Message]
    meta: dict[str, Any] = field(default_factory=dict)
    input_ids: list[int] | None = None
    loss_mask: list[int] | None = None
    tools: str | None = None  # the row's tool declarations (JSON text), None without any


def convert_row(entry: DatasetEntry, columns: dict[str, str], row: Any) -> Converted:
    """Convert one raw row with the entry's format; ``columns`` is the entry's mapping updated by
    the source's."""
    if not isinstance(row, dict):
        raise RowError(MALFORMED, f"row is a {type(row).__name__}, not an object")
    fmt = entry.row_format
    if fmt == "auto":
        fmt = "columns" if "user" in columns else "turns"
    if fmt == "pretokenized":
        out = _pretokenized(row, columns)
    elif fmt == "columns":
        out = Converted(_columns(row, columns))
    elif fmt == "pairs":
        out = Converted(_pairs(_turn_list(row, columns.get("messages", "conversation"))))
    else:
        key = columns.get("messages") or _find_turn_key(row, fmt)
        messages = _turns(_turn_list(row, key))
        system_col = columns.get("system")
        if system_col and isinstance(row.get(system_col), str) and row[system_col].strip():
            messages.insert(0, {"role": "system", "content": row[system_col]})
        out = Converted(messages, tools=_tools(row, columns))
    out.meta = _meta(entry, columns, row)
    return out


def _tools(row: dict[str, Any], columns: dict[str, str]) -> str | None:
    try:
        return read_tools(row.get(columns.get("tools", "tools")))
    except ToolCallError as err:
        raise RowError(err.reason, err.detail) from None


def _find_turn_key(row: dict[str, Any], fmt: str) -> str:
    preferred = {"sharegpt": "conversations", "messages": "messages"}.get(fmt)
    if preferred and preferred in row:
        return preferred
    for key in TURN_LIST_KEYS:
        if key in row:
            return key
    raise RowError(
        MALFORMED,
        f"no turn list: expected one of {TURN_LIST_KEYS} (or map one with columns.messages)",
    )


def _turn_list(row: dict[str, Any], key: str) -> list[Any]:
    if key not in row:
        raise RowError(MALFORMED, f"missing key {key!r}")
    turns = row[key]
    # only the JSON text of a list is read as one
    if isinstance(turns, str) and not turns.lstrip().startswith("["):
        raise RowError(MALFORMED, f"{key!r} is a str, not a list")
    try:
        return json_list(turns, repr(key))
    except ToolCallError as err:
        raise RowError(err.reason, err.detail) from None


def _text(value: Any, where: str) -> str:
    """Turn content as a string; OpenAI content parts ``[{"type": "text", "text": ...}]`` are
    joined."""
    if isinstance(value, str):
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in value)
    ):
        return "".join(p["text"] for p in value)
    raise RowError(MALFORMED, f"{where} is a {type(value).__name__}, not a string")


def _role(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RowError(MALFORMED, f"{where} role is a {type(value).__name__}, not a string")
    role = ROLE_MAP.get(value.strip().lower())
    if role is None:
        raise RowError(UNKNOWN_ROLE, f"{where} has role {value[:40]!r}; known: {sorted(ROLE_MAP)}")
    return role


def _turns(turns: list[Any]) -> list[Message]:
    """Turns in either style: ``{"from", "value"}`` (ShareGPT) or ``{"role", "content"}`` (OpenAI),
    tool calls and results included (module docstring)."""
    out = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise RowError(MALFORMED, f"turn {i} is a {type(turn).__name__}, not an object")
        role_key = "role" if "role" in turn else "from"
        text_key = next((k for k in TEXT_KEYS if k in turn), None)
        if role_key not in turn or text_key is None:
            raise RowError(MALFORMED, f"turn {i} lacks role/from or content/value")
        try:
            out.append(_message(turn, _role(turn[role_key], f"turn {i}"), text_key, i))
        except ToolCallError as err:
            raise RowError(err.reason, err.detail) from None
    return out


def _message(turn: dict[str, Any], role: str, text_key: str, i: int) -> Message:
    """One turn; an assistant turn with calls may have no text (OpenAI writes ``content: null``)."""
    if str(turn.get("role", turn.get("from"))).strip().lower() == "function_call":
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": read_calls(turn[text_key], f"turn {i}"),
        }
    raw_calls = turn.get("tool_calls") or turn.get("function_call") if role == "assistant" else None
    if raw_calls is not None and not isinstance(raw_calls, (list, dict)):
        raise RowError(
            MALFORMED, f"turn {i}: tool_calls is a {type(raw_calls).__name__}, not a list"
        )
    text = turn[text_key]
    message: Message = {
        "role": role,
        "content": "" if text is None and raw_calls else _text(text, f"turn {i}"),
    }
    if raw_calls:
        message["tool_calls"] = read_calls(raw_calls, f"turn {i}")
    if role == "assistant" and isinstance(turn.get("reasoning_content"), str):
        message["reasoning_content"] = turn["reasoning_content"]
    if role == "tool" and isinstance(turn.get("tool_call_id"), str):
        message["tool_call_id"] = turn["tool_call_id"]
    return message


def _pairs(pairs: list[Any]) -> list[Message]:
    out = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, dict) or "input" not in pair:
            raise RowError(MALFORMED, f"exchange {i} is not an object with 'input'")
        out.append({"role": "user", "content": _text(pair["input"], f"exchange {i} input")})
        if pair.get("output") is not None:
            out.append(
                {"role": "assistant", "content": _text(pair["output"], f"exchange {i} output")}
            )
    return out


def _columns(row: dict[str, Any], columns: dict[str, str]) -> list[Message]:
    """Flat columns: ``user`` is required; ``system`` and ``assistant`` are read when mapped (a
    mapped assistant column must be present)."""
    messages = []
    system_col = columns.get("system")
    if system_col and row.get(system_col) not in (None, ""):
        messages.append(
            {"role": "system", "content": _text(row[system_col], f"column {system_col!r}")}
        )
    for role in ("user", "assistant"):
        col = columns.get(role)
        if col is None:
            continue
        if col not in row or row[col] is None:
            raise RowError(MALFORMED, f"missing {role} column {col!r}")
        messages.append({"role": role, "content": _text(row[col], f"column {col!r}")})
    return messages


def _int_list(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise RowError(MALFORMED, f"{name} is not a list of integers")
    return value


def _pretokenized(row: dict[str, Any], columns: dict[str, str]) -> Converted:
    ids = _int_list(row.get(columns.get("input_ids", "input_ids")), "input_ids")
    mask = _int_list(row.get(columns.get("loss_mask", "loss_mask")), "loss_mask")
    key = columns.get("messages") or next(
        (k for k in TURN_LIST_KEYS if row.get(k) is not None), None
    )
    messages = _turns(_turn_list(row, key)) if key else []
    return Converted(messages, input_ids=ids, loss_mask=mask)


def _meta(entry: DatasetEntry, columns: dict[str, str], row: dict[str, Any]) -> dict[str, Any]:
    """License plus the row's own id/model/category/language/source/license fields when they are
    plain values."""
    meta: dict[str, Any] = {"license": entry.license}
    for key in META_KEYS:
        value = row.get(columns.get(key, key))
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            meta[key] = value
    return meta
