"""Append-only per-shard journal: what makes regeneration resumable.

One JSON line per finished sample (a regen row), and one per finished turn of a multi-turn sample
before its last (a *turn line*, marked by ``TURN_KEY``), so a kill redoes only the turns in flight,
never a finished one. Every line is written and flushed to the OS as soon as it is known, so ``kill
-9`` of the client loses only the requests in flight; ``fsync`` runs every ``fsync_every`` lines and
at close, which bounds what a machine crash can lose.

Reading never stops at damage: a torn last line (the writer died mid-line) is cut off, and any other
line that is not JSON, has no ``sample_id`` or has a field of the wrong type for ``REGEN_SCHEMA`` is
skipped, so its sample is redone. Opening the journal for a run moves those lines, with their line
number and the reason, to ``<journal>.rejects`` beside it (``shard-NNNNN.journal.rejects``) and
keeps every good line.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa

from eagle3.regen.schema import REGEN_SCHEMA, STATUS_FAILED, STATUS_OK, STATUS_TRUNCATED

logger = logging.getLogger(__name__)

# wall-clock finish time of the line (status: throughput and ETA); not a regen column
TIME_KEY = "_t"
TURN_KEY = "_turn"  # index of the finished turn a turn line records; regen rows have no such key
TURN_FIELDS: dict[str, tuple[type, ...]] = {
    "text": (str,),
    "finish_reason": (str,),
    "completion_tokens": (int,),
    "round_trip": (bool,),
    "latency_s": (int, float),
    "attempts": (int,),
    "server": (str,),
}
STATUSES = (STATUS_OK, STATUS_TRUNCATED, STATUS_FAILED)


def journal_name(index: int) -> str:
    return f"shard-{index:05d}.journal.jsonl"


def rejects_path(journal: Path) -> Path:
    """Where the damaged lines of ``journal`` go: ``shard-NNNNN.journal.rejects``."""
    return Path(journal).with_suffix(".rejects")


@dataclass
class JournalScan:
    """A journal as read: finished rows, turn lines, damaged lines (line number, reason, bytes),
    good bytes."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[tuple[int, str, bytes]] = field(default_factory=list)
    good: list[bytes] = field(default_factory=list)  # the good lines, newline included
    torn: int = 0  # bytes of a torn last line


def scan_journal(path: Path) -> JournalScan:
    """Every line of a journal sorted into rows, turn lines and rejects (see module docstring)."""
    scan = JournalScan()
    path = Path(path)
    if not path.exists():
        return scan
    data = path.read_bytes()
    good_end = data.rfind(b"\n") + 1  # bytes after the last newline are a torn line
    scan.torn = len(data) - good_end
    rows: list[tuple[int, bytes, dict[str, Any]]] = []
    for n, line in enumerate(data[:good_end].split(b"\n")[:-1], start=1):
        parsed, reason = _parse(line)
        if parsed is None:
            scan.rejects.append((n, reason, line))
        elif TURN_KEY in parsed:
            scan.turns.append(parsed)
            scan.good.append(line + b"\n")
        else:
            rows.append((n, line, parsed))
    bad_rows = _type_errors([r for _, _, r in rows])
    for n, line, row in rows:
        reason = bad_rows.get(id(row))
        if reason:
            scan.rejects.append((n, reason, line))
        else:
            scan.rows.append(row)
            scan.good.append(line + b"\n")
    scan.rejects.sort()
    return scan


def _parse(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """A line's object, or None and why it is damaged (row field types are checked by
    ``_type_errors``)."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, f"not JSON ({exc})"
    if not isinstance(obj, dict):
        return None, f"not a JSON object (a {type(obj).__name__})"
    if not isinstance(obj.get("sample_id"), str) or not obj["sample_id"]:
        return (
            None,
            "no sample_id"
            if "sample_id" not in obj
            else f"sample_id is {obj['sample_id']!r}, not a string",
        )
    if TURN_KEY in obj:
        turn = obj[TURN_KEY]
        if not isinstance(turn, int) or isinstance(turn, bool) or turn < 0:
            return None, f"{TURN_KEY} is {turn!r}, not a turn index"
        for name, types in TURN_FIELDS.items():
            value = obj.get(name)
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                return (
                    None,
                    f"turn field {name!r} is {type(value).__name__}, expected {types[0].__name__}",
                )
    elif obj.get("status") not in STATUSES:
        return None, f"status is {obj.get('status')!r}, expected one of {list(STATUSES)}"
    return obj, ""


def _type_errors(rows: list[dict[str, Any]]) -> dict[int, str]:
    """``id(row)`` -> why it does not fit ``REGEN_SCHEMA`` (what compaction writes); one Arrow
    conversion when all fit, field by field only to name the culprits."""
    try:
        pa.Table.from_pylist(rows, schema=REGEN_SCHEMA)
        return {}
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        pass
    errors = {}
    for row in rows:
        for schema_field in REGEN_SCHEMA:
            try:
                pa.array([row.get(schema_field.name)], type=schema_field.type)
            except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
                errors[id(row)] = (
                    f"field {schema_field.name!r} does not fit {schema_field.type} ({exc})"
                )
                break
    return errors


def read_journal(path: Path) -> list[dict[str, Any]]:
    """The finished rows of a journal (turn lines, damaged lines and a torn tail left out)."""
    return scan_journal(path).rows


def repair_journal(path: Path) -> JournalScan:
    """Scan ``path``, move damaged lines to its rejects file, cut a torn tail; returns the scan."""
    scan = scan_journal(path)
    if scan.rejects:
        with open(rejects_path(path), "ab") as fh:
            for n, reason, line in scan.rejects:
                entry = {
                    "line": n,
                    "reason": reason,
                    "text": line.decode("utf-8", errors="replace"),
                }
                fh.write(json.dumps(entry, ensure_ascii=False).encode() + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.writelines(scan.good)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        logger.warning(
            "%s: %d damaged lines moved to %s (e.g. line %d: %s); their samples are redone",
            path,
            len(scan.rejects),
            rejects_path(path),
            scan.rejects[0][0],
            scan.rejects[0][1],
        )
    elif scan.torn:
        logger.warning("%s: cutting a torn last line (%d bytes)", path, scan.torn)
        with open(path, "r+b") as fh:
            fh.truncate(path.stat().st_size - scan.torn)
    return scan


class Journal:
    """Appends lines to a journal file (see module docstring); opening it repairs it. ``done``:
    finished sample ids; ``turns``: for unfinished samples, the records of their first finished
    turns (0, 1, ... without a gap)."""

    def __init__(self, path: Path, *, fsync_every: int) -> None:
        self.path = Path(path)
        self.fsync_every = fsync_every
        scan = repair_journal(self.path)
        self.done = {r["sample_id"] for r in scan.rows}
        self.turns = _turn_prefixes(scan.turns, self.done)
        self._fh = open(self.path, "ab")  # noqa: SIM115 - closed in close()
        self._unsynced = 0

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def append(self, line: dict[str, Any]) -> None:
        """A finished row, or a turn line (one with ``TURN_KEY``)."""
        text = json.dumps(
            {**line, TIME_KEY: time.time()}, ensure_ascii=False, separators=(",", ":")
        )
        self._fh.write(text.encode() + b"\n")
        self._fh.flush()
        if TURN_KEY not in line:
            self.done.add(line["sample_id"])
        self._unsynced += 1
        if self._unsynced >= self.fsync_every:
            self.sync()

    def sync(self) -> None:
        os.fsync(self._fh.fileno())
        self._unsynced = 0

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
            self._fh.close()


def _turn_prefixes(turns: list[dict[str, Any]], done: set[str]) -> dict[str, list[dict[str, Any]]]:
    by_sample: dict[str, dict[int, dict[str, Any]]] = {}
    for t in turns:
        if t["sample_id"] not in done:
            # first record of a turn wins
            by_sample.setdefault(t["sample_id"], {}).setdefault(t[TURN_KEY], t)
    prefixes = {}
    for sid, records in by_sample.items():
        n = 0
        while n in records:
            n += 1
        if n:
            prefixes[sid] = [records[i] for i in range(n)]
    return prefixes
