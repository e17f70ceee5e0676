"""SGLang request logs: the requests a server answered, read back as joined records.

SGLang 0.5.23 writes them with ``--log-requests --log-requests-format json --log-requests-target
DIR`` (``sglang/srt/utils/request_logger.py``, ``log_utils.py``); the reference server writes the
same files (``eagle3.serve.reference.request_log``). What they look like:

* files ``<DIR>/<hostname>_<rank>.log``, rotated every hour by Python's ``TimedRotatingFileHandler``
  into ``<hostname>_<rank>.log.YYYY-mm-dd_HH`` (never deleted);
* one line per event: ``[YYYY-mm-dd HH:MM:SS] `` then a JSON object ``{timestamp, event, rid, obj,
  out?, headers?}``; events ``request.received`` (``obj``: the request as the tokenizer manager
  holds it: ``input_ids`` or ``text``, ``sampling_params``, ``stream``) and ``request.finished``
  (the same ``obj``, plus ``out``: ``text``, ``output_ids`` and ``meta_info`` with
  ``finish_reason``, token counts, ``e2e_latency`` and, on a speculative server,
  ``spec_accept_length`` and its siblings); at level >= 2 also ``request.received.openai`` (the raw
  chat payload, no rid), which carries nothing a joined record needs;
* ``--log-requests-level`` 3 logs every field untruncated; 2 cuts lists and strings over 2048 items
  into head + ``"..."`` + tail; 0 and 1 drop the prompt and output (1 keeps ``sampling_params``):
  telemetry without content.

``iter_log`` joins ``request.received`` to ``request.finished`` by rid over every file of a source,
in file order (rotated files before the live one), so a request received before a rotation and
finished after it is one record. It yields a ``ServedRequest`` per finished request and a
``LogReject`` (a quarantine reason and the raw line) for everything else, so a reader's books
balance: a garbled line (``malformed``), a line cut at the end of a file (``partial``: the file was
copied or read while being written), a request received but never finished in these files
(``unfinished``: in flight at the cut, or its finish is in a file not here), a finish whose receipt
is not in these files (``unmatched``: rotated out of the window), and a request logged twice
(``duplicate``: a file copied twice). Whether a record is usable as training data (health checks,
aborts, truncation, content cut by the log level, the chat template) is ``eagle3.data.served``'s
business; telemetry readers take every record.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from eagle3.data.readers import truncate_raw
from eagle3.data.schema import DUPLICATE, MALFORMED, PARTIAL, UNFINISHED, UNMATCHED

RECEIVED, FINISHED, OPENAI = "request.received", "request.finished", "request.received.openai"
LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] (.*)$", re.DOTALL)
# `<host>_<rank>.log`, and TimedRotatingFileHandler's hourly backups
# `<host>_<rank>.log.YYYY-mm-dd_HH`
LOG_NAME = re.compile(r"^(?P<base>.+\.log)(?:\.(?P<rotated>\d{4}-\d\d-\d\d_\d\d))?$")
# SGLang's rid prefix for /health_generate (sglang.srt.constants)
HEALTH_CHECK_PREFIX = "HEALTH_CHECK"
# a server's /server_info beside its logs (eagle3.serve.launch)
SERVER_INFO_FILE = "server_info.json"
LOG_FLAGS = ("--log-requests", "--log-requests-format", "json")
TARGET_FLAG = "--log-requests-target"


def log_flags(directory: str | Path, *, level: int = 3) -> list[str]:
    """The flags that make SGLang (or the reference server) write what ``iter_log`` reads into
    ``directory`` (level 3: every field; 0 and 1: ``meta_info`` only)."""
    return [*LOG_FLAGS, "--log-requests-level", str(level), TARGET_FLAG, str(directory)]


def log_dirs(argv: Sequence[str]) -> list[str]:
    """The directories a server command logs requests into (the values of ``--log-requests-target``
    other than ``stdout``), none unless it logs requests."""
    if "--log-requests" not in argv or TARGET_FLAG not in argv:
        return []
    values = []
    for token in argv[list(argv).index(TARGET_FLAG) + 1 :]:
        if token.startswith("--"):
            break
        values.append(token)
    return [v for v in values if v.lower() != "stdout"]


@dataclass(frozen=True)
class ServedRequest:
    """One finished request, joined from its two log lines. ``input_ids``/``output_ids`` are None
    when the log level dropped them (or a list of ids with ``"..."`` where level 2 cut it);
    ``received_at`` and ``finished_at`` are the events' own timestamps (seconds since the epoch, the
    server's clock)."""

    rid: str
    received_at: float
    finished_at: float
    file: str
    line: int  # of the finish, 1-based
    obj: dict[str, Any]
    out: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The request's identity in the logs: rid and the time it was received (rids are unique
        while in flight only; a client may reuse one later)."""
        return hashlib.sha256(f"{self.rid}|{self.received_at:.6f}".encode()).hexdigest()[:32]

    @property
    def meta_info(self) -> dict[str, Any]:
        meta = self.out.get("meta_info")
        return meta if isinstance(meta, dict) else {}

    @property
    def finish_type(self) -> str | None:
        reason = self.meta_info.get("finish_reason")
        return (
            reason.get("type")
            if isinstance(reason, dict)
            else reason
            if isinstance(reason, str)
            else None
        )

    @property
    def input_ids(self) -> Any:
        return self.obj.get("input_ids")

    @property
    def prompt_text(self) -> Any:
        return self.obj.get("text")

    @property
    def output_ids(self) -> Any:
        return self.out.get("output_ids")

    @property
    def output_text(self) -> Any:
        return self.out.get("text")

    @property
    def sampling_params(self) -> dict[str, Any]:
        params = self.obj.get("sampling_params")
        return params if isinstance(params, dict) else {}

    @property
    def health_check(self) -> bool:
        return self.rid.startswith(HEALTH_CHECK_PREFIX)


@dataclass(frozen=True)
class LogReject:
    """A log line (or an unpaired request) that is not a finished request; ``reason`` is a
    quarantine reason."""

    reason: str
    detail: str
    raw: str
    file: str
    line: int


LogRecord = ServedRequest | LogReject


def is_log_file(path: Path) -> bool:
    return path.is_file() and LOG_NAME.match(path.name) is not None


def _order(path: Path) -> tuple[str, str, str]:
    """Rotated backups (oldest first) before the live file of the same name."""
    match = LOG_NAME.match(path.name)
    assert match is not None
    return (
        str(path.parent / match["base"]),
        "0" if match["rotated"] else "1",
        match["rotated"] or "",
    )


def log_files(path: str | Path) -> list[Path]:
    """The request log files under ``path`` (a file, or a directory searched recursively), in
    reading order."""
    p = Path(path).expanduser()
    files = (
        [p] if p.is_file() else [f for f in p.rglob("*") if is_log_file(f)] if p.is_dir() else []
    )
    return sorted(files, key=_order)


def _epoch(stamp: Any) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


@dataclass
class _Line:
    event: str
    rid: str
    at: float
    doc: dict[str, Any]
    file: str
    line: int
    raw: str


def _parse(text: str, file: str, number: int, last: bool) -> _Line | LogReject | None:
    """One line of a log file: an event, a reject, or None for an event a record does not need."""
    ended = text.endswith("\n")
    body = text.rstrip("\r\n")
    if not body.strip():
        return None
    raw = truncate_raw(body, limit=1024)  # quarantined inside a row of its own (RAW_MAX_BYTES)
    if last and not ended:
        return LogReject(
            PARTIAL,
            "the file ends inside this line (copied or read while it was written)",
            raw,
            file,
            number,
        )
    match = LINE.match(body)
    if match is None:
        return LogReject(
            MALFORMED, "not a `[YYYY-mm-dd HH:MM:SS] {json}` request-log line", raw, file, number
        )
    try:
        doc = json.loads(match[2])
    except (json.JSONDecodeError, RecursionError):
        return LogReject(
            MALFORMED, "the JSON after the time prefix does not parse", raw, file, number
        )
    if not isinstance(doc, dict) or not isinstance(doc.get("event"), str):
        return LogReject(MALFORMED, "not an event object (no `event`)", raw, file, number)
    if doc["event"] not in (RECEIVED, FINISHED):
        return None  # request.received.openai and events of later releases: nothing a record needs
    rid, at = doc.get("rid"), _epoch(doc.get("timestamp"))
    if not isinstance(rid, str) or at is None or not isinstance(doc.get("obj"), dict):
        what = (
            "a batch request (its rid is a list)"
            if isinstance(rid, list)
            else "no string rid, timestamp or obj"
        )
        return LogReject(MALFORMED, f"{doc['event']} with {what}", raw, file, number)
    if doc["event"] == FINISHED and not isinstance(doc.get("out"), dict):
        return LogReject(MALFORMED, "request.finished without an `out` object", raw, file, number)
    return _Line(doc["event"], rid, at, doc, file, number, raw)


def _file_lines(path: Path) -> Iterator[_Line | LogReject]:
    with open(path, "rb") as fh:
        previous: bytes | None = None
        number = 0
        for data in fh:  # one line behind, so the last one is known
            if previous is not None:
                number += 1
                parsed = _parse(previous.decode("utf-8", "replace"), str(path), number, last=False)
                if parsed is not None:
                    yield parsed
            previous = data
        if previous is not None:
            parsed = _parse(previous.decode("utf-8", "replace"), str(path), number + 1, last=True)
            if parsed is not None:
                yield parsed


def _headers(doc: dict[str, Any]) -> dict[str, str]:
    headers = doc.get("headers")
    return {str(k).lower(): str(v) for k, v in headers.items()} if isinstance(headers, dict) else {}


def _reject(item: _Line, reason: str, detail: str) -> LogReject:
    return LogReject(reason, detail, item.raw, item.file, item.line)


def _joined(received: _Line, finished: _Line) -> ServedRequest:
    return ServedRequest(
        rid=finished.rid,
        received_at=received.at,
        finished_at=finished.at,
        file=finished.file,
        line=finished.line,
        obj=finished.doc["obj"],
        out=finished.doc["out"],
        headers=_headers(received.doc) | _headers(finished.doc),
    )


def iter_log(files: Sequence[Path]) -> Iterator[LogRecord]:
    """Every finished request of ``files`` (joined by rid, in finish order) and every line that is
    not one (module docstring); requests still open at the end are ``unfinished`` rejects, in the
    order they were received."""
    waiting: dict[str, deque[_Line]] = {}
    seen: set[bytes] = set()
    for path in files:
        for item in _file_lines(path):
            if isinstance(item, LogReject):
                yield item
                continue
            stamp = f"{item.event}|{item.rid}|{item.doc.get('timestamp')}"
            identity = hashlib.sha256(stamp.encode()).digest()[:12]
            if identity in seen:
                yield _reject(item, DUPLICATE, f"{item.event} of rid {item.rid} is logged twice")
                continue
            seen.add(identity)
            if item.event == RECEIVED:
                waiting.setdefault(item.rid, deque()).append(item)
                continue
            queue = waiting.get(item.rid)
            if not queue:
                yield _reject(
                    item,
                    UNMATCHED,
                    f"rid {item.rid} finished but its receipt is not "
                    "in these files (rotated out of the window?)",
                )
                continue
            yield _joined(queue.popleft(), item)
            if not queue:
                del waiting[item.rid]
    open_ = sorted((line for queue in waiting.values() for line in queue), key=lambda x: x.at)
    for line in open_:
        yield _reject(
            line,
            UNFINISHED,
            f"rid {line.rid} was received but never finished in these "
            "files (in flight at the cut, or finished in a file that is not here)",
        )


def count_records(files: Sequence[Path]) -> int:
    """How many records ``iter_log`` yields (the source's rows in the catalog)."""
    return sum(1 for _ in iter_log(files))


def sniff(path: Path) -> str | None:
    """Why ``path`` is not an SGLang request log in JSON format (from its first non-blank lines),
    else None."""
    with open(path, "rb") as fh:
        for data in fh:
            text = data.decode("utf-8", "replace").strip()
            if not text:
                continue
            match = LINE.match(text)
            if match is None or not match[2].startswith("{"):
                return (
                    f"{path}: lines are not `[YYYY-mm-dd HH:MM:SS] {{json}}` (serve with "
                    "--log-requests "
                    "--log-requests-format json --log-requests-target DIR)"
                )
            return None
    return None
