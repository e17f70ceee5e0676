"""Reading SGLang request logs (``eagle3.data.served_log``) from logs the reference server wrote for
served traffic (the ``served_traffic`` session fixture), and from copies of them damaged the ways
real log directories are."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from eagle3.data.served_log import LogReject, ServedRequest, iter_log, log_dirs, log_files


def _lines(traffic) -> list[str]:
    (live,) = log_files(traffic.log_dir)
    return live.read_text().splitlines(keepends=True)


def _requests(records) -> list[ServedRequest]:
    return [r for r in records if isinstance(r, ServedRequest)]


def _event(line: str) -> dict:
    return json.loads(line.split("] ", 1)[1])


def test_every_finished_request_is_joined_to_its_receipt_once(served_traffic):
    records = list(iter_log(log_files(served_traffic.log_dir)))
    requests = _requests(records)
    assert [r for r in records if isinstance(r, LogReject)] == []
    finished = [_event(line) for line in _lines(served_traffic) if '"request.finished"' in line]
    assert sorted(r.rid for r in requests) == sorted(e["rid"] for e in finished)
    assert len({r.key for r in requests}) == len(requests) == served_traffic.report["requests"]
    assert all(
        r.finished_at >= r.received_at and r.output_ids and r.meta_info["finish_reason"]
        for r in requests
    )
    chat = [r for r in requests if r.rid.startswith("chatcmpl-")]
    assert chat and all(r.input_ids and r.headers.get("x-smg-routing-key") for r in chat)


def test_a_request_split_by_the_hourly_rotation_is_one_record(served_traffic, tmp_path):
    lines = _lines(served_traffic)
    events = [_event(line) for line in lines]
    # cut where a request was received before the cut and finished after it
    cut = next(
        i
        for i in range(1, len(lines))
        if events[i]["event"] == "request.finished"
        and any(e.get("rid") == events[i]["rid"] for e in events[i - 2 : i - 1])
    )
    (tmp_path / "vm_0.log.2026-12-06_13").write_text("".join(lines[: cut - 1]))
    (tmp_path / "vm_0.log").write_text("".join(lines[cut - 1 :]))
    assert [f.name for f in log_files(tmp_path)] == ["vm_0.log.2026-12-06_13", "vm_0.log"]
    whole = _requests(iter_log(log_files(served_traffic.log_dir)))
    split = list(iter_log(log_files(tmp_path)))
    assert [r.key for r in _requests(split)] == [r.key for r in whole] and len(split) == len(whole)


def test_partial_garbled_duplicate_unfinished_and_unmatched_lines_each_get_their_reason(
    served_traffic, tmp_path
):
    lines = _lines(served_traffic)
    events = [_event(line) for line in lines]
    finishes = [i for i, e in enumerate(events) if e["event"] == "request.finished"]
    no_finish = events[finishes[3]]["rid"]  # its finish goes: received, never finished
    no_receipt = events[finishes[5]]["rid"]  # its receipt goes: finished, receipt rotated out
    kept = [
        line
        for line, e in zip(lines, events, strict=True)
        if not (e.get("rid") == no_finish and e["event"] == "request.finished")
        and not (e.get("rid") == no_receipt and e["event"] == "request.received")
    ]
    kept.insert(10, "Traceback (most recent call last): not a log line\n")
    kept.insert(20, kept[19].split("] ", 1)[0] + '] {"event": "request.received", "rid": \n')
    # cut mid-line, no newline
    (tmp_path / "vm_0.log").write_text("".join(kept) + lines[finishes[-1]][:80])
    # the same file copied under another name
    shutil.copy(tmp_path / "vm_0.log", tmp_path / "vm_1.log")
    records = list(iter_log(log_files(tmp_path)))
    reasons = Counter(r.reason for r in records if isinstance(r, LogReject))
    requests = _requests(records)
    assert reasons["malformed"] == 4 and reasons["partial"] == 2 and reasons["unmatched"] == 1
    # each event of the copy
    assert reasons["unfinished"] == 1 and reasons["duplicate"] == 2 * len(requests) + 2
    assert {r.rid for r in requests}.isdisjoint({no_finish, no_receipt})
    assert len({r.key for r in requests}) == len(requests), "a request was read twice"
    bad = next(r for r in records if isinstance(r, LogReject) and r.reason == "partial")
    assert bad.file.endswith("vm_0.log") and "ends inside this line" in bad.detail


@pytest.mark.parametrize(
    ("argv", "dirs"),
    [
        (["--log-requests", "--log-requests-target", "stdout", "/a", "--port", "1"], ["/a"]),
        (["--log-requests-target", "/a"], []),  # not logging
        (["--log-requests"], []),  # logging to stdout only
    ],
)
def test_the_directories_a_server_command_logs_into(argv: list[str], dirs: list[str]):
    assert log_dirs(argv) == dirs


def test_log_files_are_the_request_logs_only(tmp_path: Path):
    for name in (
        "h_0.log",
        "h_0.log.2026-01-01_00",
        "h_0.log.2025-12-31_23",
        "server_info.json",
        "x.txt",
    ):
        (tmp_path / name).write_text("")
    assert [f.name for f in log_files(tmp_path)] == [
        "h_0.log.2025-12-31_23",
        "h_0.log.2026-01-01_00",
        "h_0.log",
    ]
