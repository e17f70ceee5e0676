"""Prompt sets: the benchmark prompts the gate measures, decontamination keeps out of training and
``eagle3 eval`` decodes, read from the files people have. One reader for all three.

A prompt set is a JSONL file or a JSON array, gzip-compressed or not (``eagle3.data.readers``),
whose rows each have one of these shapes (the first that fits, in this order):

- ``prompt``: ``{"prompt": str}`` (the project's rows, HumanEval's): the prompt is sent; a row's
  ``messages`` and ``tools``, when it has them, are the conversation to continue (tool use).
- ``turns``: ``{"turns": [str, ...]}`` (MT-bench): the first turn is sent, every turn is checked.
- ``text``: a ``question``, ``instruction``, ``problem``, ``input`` or ``text`` string: sent.
- ``sharegpt``: ``{"conversations": [{"from", "value"}]}``: the first user turn is sent (after a
  system turn, if any), every user turn is checked.
- ``messages``: ``{"messages": [{"role", "content"}]}``: as ``sharegpt``.
- ``string``: a bare JSON string: sent.

A row's id is its ``id``, ``question_id``, ``task_id`` or ``sample_id``, else ``<set>-<row>``. A row
of no known shape, a malformed line or a cut array is refused with one line naming the file, the row
and the shapes expected (``PromptSetError``): a benchmark is measured on the whole set or not at
all. ``check_prompt_set`` runs the same rules over a file's first rows when a config is loaded, so a
wrong file fails before any work starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.data.readers import iter_rows
from eagle3.errors import DataError

TEXT_KEYS: tuple[str, ...] = ("question", "instruction", "problem", "input", "text")
ID_KEYS: tuple[str, ...] = ("id", "question_id", "task_id", "sample_id")
USER_ROLES = {"user", "human"}
SYSTEM_ROLES = {"system"}
EXPECTED = (
    "a 'prompt' string (HumanEval, {id, prompt}), 'turns' (MT-bench: a list of strings), one of "
    f"{', '.join(repr(k) for k in TEXT_KEYS)} (a string), "
    "'conversations' (ShareGPT: [{from, value}]), 'messages' ([{role, content}]), "
    "or a bare JSON string"
)
CHECK_ROWS = 1000  # rows a config load reads of each local prompt set


class PromptSetError(DataError):
    """A prompt set that cannot be read as one; the message names the file, the row and the shapes
    expected."""


@dataclass(frozen=True)
class PromptRow:
    """One benchmark prompt: ``prompt`` is what a single-turn benchmark sends, ``messages`` a
    conversation to continue instead (empty: one user turn, ``prompt``), ``turns`` every user text
    of the row (what decontamination compares training prompts against)."""

    prompt_id: str
    prompt: str
    turns: tuple[str, ...]
    messages: tuple[dict[str, Any], ...] = ()
    tools: tuple[dict[str, Any], ...] = ()
    shape: str = "prompt"


def _turn_text(turn: Any, text_key: str) -> str | None:
    value = turn.get(text_key) if isinstance(turn, dict) else None
    return value if isinstance(value, str) else None


def _conversation(turns: Any, role_key: str, text_key: str) -> tuple[list[str], list[str]] | None:
    """(system texts before the first user turn, user texts) of a turn list, or None when it is not
    one."""
    if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
        return None
    system: list[str] = []
    users: list[str] = []
    for turn in turns:
        role, text = str(turn.get(role_key, "")).lower(), _turn_text(turn, text_key)
        if text is None:
            return None
        if role in USER_ROLES:
            users.append(text)
        elif role in SYSTEM_ROLES and not users:
            system.append(text)
    return (system, users) if users else None


def _from_conversation(
    row: dict[str, Any], key: str, role_key: str, text_key: str
) -> PromptRow | None:
    found = _conversation(row.get(key), role_key, text_key)
    if found is None:
        return None
    system, users = found
    messages = tuple({"role": "system", "content": s} for s in system)
    first = users[0]
    messages = (*messages, {"role": "user", "content": first}) if messages else ()
    return PromptRow(
        "", first, tuple(users), messages, (), "sharegpt" if key == "conversations" else "messages"
    )


def shape_of(row: Any) -> PromptRow | None:
    """The row as a ``PromptRow`` (its id left empty), or None when it has no known shape."""
    if isinstance(row, str):
        return PromptRow("", row, (row,), shape="string")
    if not isinstance(row, dict):
        return None
    if isinstance(row.get("prompt"), str):
        prompt = row["prompt"]
        return PromptRow(
            "", prompt, (prompt,), tuple(row.get("messages") or ()), tuple(row.get("tools") or ())
        )
    turns = row.get("turns")
    if isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns):
        return PromptRow("", turns[0], tuple(turns), shape="turns")
    for key in TEXT_KEYS:
        if isinstance(row.get(key), str):
            return PromptRow("", row[key], (row[key],), shape="text")
    return _from_conversation(row, "conversations", "from", "value") or _from_conversation(
        row, "messages", "role", "content"
    )


def _row_id(row: Any, set_name: str, index: int) -> str:
    if isinstance(row, dict):
        for key in ID_KEYS:
            if row.get(key) is not None:
                return str(row[key])
    return f"{set_name}-{index}"


def _describe(row: Any) -> str:
    if isinstance(row, dict):
        convs = [k for k in ("conversations", "messages") if isinstance(row.get(k), list)]
        if convs:
            return f"a {convs[0]!r} list without a user turn of text (keys {sorted(row)[:12]})"
        return f"keys {sorted(row)[:12]}"
    return f"a JSON {type(row).__name__}"


def _rows(path: Path, set_name: str, limit: int | None) -> Iterable[PromptRow]:
    if not path.is_file():
        raise FileNotFoundError(
            f"prompt set {set_name!r}: {path} does not exist; fix gate.prompt_sets.{set_name}"
        )
    for raw in iter_rows([path]):
        if limit is not None and raw.index >= limit:
            return
        where = f"prompt set {set_name!r}: {path} row {raw.index + 1}"
        if raw.error is not None:
            raise PromptSetError(
                f"{where} is {raw.error} ({raw.raw[:80]!r}); each row must be JSON with {EXPECTED}"
            )
        found = shape_of(raw.value)
        if found is None:
            raise PromptSetError(
                f"{where} has {_describe(raw.value)}; a prompt set row needs {EXPECTED}"
            )
        yield PromptRow(
            _row_id(raw.value, set_name, raw.index),
            found.prompt,
            found.turns,
            found.messages,
            found.tools,
            found.shape,
        )


def read_prompt_set(
    path: str | Path, set_name: str, *, limit: int | None = None
) -> list[PromptRow]:
    """The first ``limit`` rows (all when None) of a local prompt set; raises ``PromptSetError``
    (one line)."""
    rows = list(_rows(Path(path).expanduser(), set_name, limit))
    if not rows:
        raise PromptSetError(
            f"prompt set {set_name!r}: {path} holds no rows; fix gate.prompt_sets.{set_name}"
        )
    return rows


def check_prompt_set(path: str | Path, set_name: str) -> None:
    """Raise ``PromptSetError`` when the first ``CHECK_ROWS`` rows of a local prompt set do not all
    have a known shape; a file that does not exist yet (a world built by the run's first task) is
    not checked here."""
    if Path(path).expanduser().is_file():
        read_prompt_set(path, set_name, limit=CHECK_ROWS)
