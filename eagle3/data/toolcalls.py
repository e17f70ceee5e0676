"""Tool calls as structured data: read from every source layout, then linked to their results and
checked.

One shape everywhere (prompts rows, regen rows): an assistant message may carry ``tool_calls``, a
list of ``{"id", "name", "arguments"}`` with ``arguments`` a JSON text of an object (as OpenAI
messages carry it); a ``tool`` message carries its result and the ``tool_call_id`` it answers. What
the sources write:

* OpenAI messages: ``tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}]``
  (arguments a JSON string, or an object some exporters write), or the legacy ``function_call:
  {"name", "arguments"}``; results are ``role: tool`` with ``tool_call_id`` (or legacy ``role:
  function`` with a ``name``).
* ShareGPT with function calls (LLaMA-Factory's layout, APIGen-MT, ToolACE exports): a
  ``function_call`` turn whose value is the JSON of one call ``{"name", "arguments"}`` (or a list of
  them), then ``observation`` turns.

``read_calls`` raises ``malformed`` for layouts it cannot read (a call that is not an object, no
name); the semantics are the normalizer's (``link_tool_calls``, reason ``bad_tool_call``): arguments
that are not a JSON object, a result that answers no call of the turn before it, more results than
calls, two calls with one id, a call never answered before the next user turn. Calls without an id
get ``functions.<name>:<k>`` (``k`` counts the conversation's calls: Kimi's rule) and results
without an id answer the turn's calls in order.
"""

from __future__ import annotations

import json
from typing import Any

from eagle3.data.schema import BAD_TOOL_CALL, MALFORMED

Message = dict[str, Any]


class ToolCallError(ValueError):
    """A tool call that cannot be read (``reason`` is a quarantine reason)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def _arguments(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    raise ToolCallError(
        BAD_TOOL_CALL, f"{where}: arguments are a {type(value).__name__}, not a JSON object"
    )


def _one_call(raw: Any, where: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise ToolCallError(MALFORMED, f"{where} is a {type(raw).__name__}, not an object")
    function = raw.get("function", raw)
    if not isinstance(function, dict):
        raise ToolCallError(
            MALFORMED, f"{where}: function is a {type(function).__name__}, not an object"
        )
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolCallError(MALFORMED, f"{where} has no function name")
    call_id = raw.get("id")
    return {
        "id": call_id if isinstance(call_id, str) else "",
        "name": name,
        "arguments": _arguments(function.get("arguments", {}), where),
    }


def read_calls(value: Any, where: str) -> list[dict[str, str]]:
    """Calls from an OpenAI ``tool_calls`` list, a legacy ``function_call`` object, or a ShareGPT
    ``function_call`` value (JSON text of a call or a list of calls)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ToolCallError(BAD_TOOL_CALL, f"{where} is not JSON ({exc.msg})") from None
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ToolCallError(MALFORMED, f"{where} is an empty list of calls")
    return [_one_call(item, f"{where} call {k}") for k, item in enumerate(items)]


def json_list(value: Any, name: str) -> list[Any]:
    """``value`` as a list: a list, or the JSON text of one (agentic datasets store lists as text);
    a malformed ``ToolCallError`` naming ``name`` otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ToolCallError(MALFORMED, f"{name} is not valid JSON ({exc.msg})") from None
    if not isinstance(value, list):
        raise ToolCallError(MALFORMED, f"{name} is a {type(value).__name__}, not a list")
    return value


def read_tools(value: Any) -> str | None:
    """The tool declarations as one JSON text (a list of objects), from a list, a JSON text, or a
    list of JSON texts (some exporters store each tool as a string); None when there are none."""
    if value is None or value == "" or value == []:
        return None
    tools = [json.loads(t) if isinstance(t, str) else t for t in json_list(value, "tools")]
    if not all(isinstance(t, dict) for t in tools):
        raise ToolCallError(MALFORMED, "tools holds an entry that is not an object")
    return json.dumps(tools, ensure_ascii=False) if tools else None


def _check_arguments(call: dict[str, str], where: str) -> None:
    try:
        parsed = json.loads(call["arguments"])
    except json.JSONDecodeError as exc:
        raise ToolCallError(BAD_TOOL_CALL, f"{where}: arguments are not JSON ({exc.msg})") from None
    if not isinstance(parsed, dict):
        raise ToolCallError(
            BAD_TOOL_CALL, f"{where}: arguments are a JSON {type(parsed).__name__}, not an object"
        )


def _name_calls(messages: list[Message]) -> None:
    """Give id-less calls Kimi's ``functions.<name>:<k>`` and check every call's arguments and id
    uniqueness."""
    k = 0
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") or []
        for call in calls:
            _check_arguments(call, f"turn {i} call {call['name']!r}")
            call["id"] = call["id"] or f"functions.{call['name']}:{k}"
            k += 1
        ids = [c["id"] for c in calls]
        if len(set(ids)) != len(ids):
            raise ToolCallError(BAD_TOOL_CALL, f"turn {i}: two calls share one id ({ids})")


def link_tool_calls(messages: list[Message]) -> list[Message]:
    """Messages with every call named and every result tied to a call of the turn before it (module
    docstring); raises ``ToolCallError``. Results after an assistant turn without structured calls
    (calls written as text) stay as they are."""
    _name_calls(messages)
    # the ids the current run of results may answer; None: free text
    pending: list[str] | None = None
    answered: set[str] = set()
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            pending, answered = [c["id"] for c in m.get("tool_calls") or []] or None, set()
        elif m["role"] == "tool" and pending is not None:
            tool_id = m.get("tool_call_id") or (
                pending[len(answered)] if len(answered) < len(pending) else ""
            )
            if not tool_id or tool_id not in pending or tool_id in answered:
                why = (
                    "more results than calls"
                    if not tool_id
                    else f"answers {tool_id!r}, not a call of the turn"
                )
                raise ToolCallError(
                    BAD_TOOL_CALL, f"turn {i}: tool result {why} (calls: {pending})"
                )
            m["tool_call_id"] = tool_id
            answered.add(tool_id)
        elif m["role"] == "user":
            missing = [c for c in pending or [] if c not in answered]
            if missing:
                raise ToolCallError(
                    BAD_TOOL_CALL, f"turn {i}: a user turn before the results of calls {missing}"
                )
            pending = None
    return messages
