"""Append-only per-shard journal: one JSON line per finished sample, what makes regeneration resumable.

Every line is written and flushed to the OS as soon as its sample finishes, so ``kill -9`` of the client loses only
the requests in flight; ``fsync`` runs every ``fsync_every`` lines and at close, which bounds what a machine crash
can lose. A torn last line (the writer died mid-line) is cut off when the journal is opened again; a line that does
not parse anywhere else means the file was edited or damaged and is an error.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

logger = logging.getLogger(__name__)

TIME_KEY = "_t"  # wall-clock finish time of the line (status: throughput and ETA); not a regen column


class JournalError(RuntimeError):
    """A journal line other than the last one does not parse."""


def journal_name(index: int) -> str:
    return f"shard-{index:05d}.journal.jsonl"


def read_journal(path: Path, *, repair: bool = False) -> list[dict[str, Any]]:
    """Rows of a journal, torn last line ignored (and cut off the file when ``repair``)."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    good_end = data.rfind(b"\n") + 1  # bytes after the last newline are a torn line
    rows = []
    lines = data[:good_end].split(b"\n")[:-1]
    for n, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if n == len(lines) - 1:  # a torn line that happened to end with a newline byte
                good_end -= len(line) + 1
                break
            raise JournalError(
                f"{path}: line {n + 1} is not JSON ({exc}); delete the journal to redo the shard"
            ) from exc
    if good_end < len(data):
        logger.warning("%s: ignoring a torn last line (%d bytes)", path, len(data) - good_end)
        if repair:
            with open(path, "r+b") as fh:
                fh.truncate(good_end)
    return rows


class Journal:
    """Appends rows to a journal file (see module docstring); opening it repairs a torn tail."""

    def __init__(self, path: Path, *, fsync_every: int) -> None:
        self.path = Path(path)
        self.fsync_every = fsync_every
        self.done = {r["sample_id"] for r in read_journal(self.path, repair=True)}
        self._fh = open(self.path, "ab")  # noqa: SIM115 - closed in close()
        self._unsynced = 0

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def append(self, row: dict[str, Any]) -> None:
        line = json.dumps({**row, TIME_KEY: time.time()}, ensure_ascii=False, separators=(",", ":"))
        self._fh.write(line.encode() + b"\n")
        self._fh.flush()
        self.done.add(row["sample_id"])
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
