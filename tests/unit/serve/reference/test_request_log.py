"""The reference server's request logs (``--log-requests*``): SGLang 0.5.23's files, lines and
levels, read back by the served-traffic reader (``eagle3.data.served_log``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from eagle3.data.served_log import (
    FINISHED,
    OPENAI,
    RECEIVED,
    SERVER_INFO_FILE,
    ServedRequest,
    iter_log,
    log_files,
)
from eagle3.serve.launch import reference_server
from eagle3.serve.reference.protocol import SamplingParams
from eagle3.serve.reference.request_log import RequestLog
from eagle3.serve.reference.requests import GenerateRequest


@pytest.fixture(scope="module")
def logged(serve_model_dir: Path, tmp_path_factory):
    """A reference server logging at level 3 in JSON, sent one request of each kind; its log
    directory."""
    logs = tmp_path_factory.mktemp("request-logs")
    flags = [
        "--num-threads",
        "1",
        "--log-requests",
        "--log-requests-level",
        "3",
        "--log-requests-format",
        "json",
        "--log-requests-target",
        str(logs),
    ]
    greedy = {"max_new_tokens": 6, "temperature": 0}
    requests = [
        ("/generate", {"rid": "ids", "input_ids": [5, 6, 7, 8], "sampling_params": greedy}),
        ("/generate", {"rid": "text", "text": "hello there", "sampling_params": greedy}),
        (
            "/generate",
            {"rid": "stream", "input_ids": [5, 6, 7], "sampling_params": greedy, "stream": True},
        ),
        (
            "/v1/chat/completions",
            {"rid": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6},
        ),
    ]

    async def send(url: str) -> None:
        async with aiohttp.ClientSession() as session:
            for path, body in requests:
                async with session.post(
                    url + path, json=body, headers={"x-smg-routing-key": "k"}
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()

    with reference_server(serve_model_dir, extra_args=flags) as server:
        asyncio.run(send(server.url))
        urllib.request.urlopen(server.url + "/health_generate", timeout=60).read()
    return logs


def _events(logs: Path) -> list[dict]:
    (path,) = log_files(logs)
    lines = path.read_text().splitlines()
    # [YYYY-mm-dd HH:MM:SS] {json}
    assert all(line[0] == "[" and line[20:22] == "] " for line in lines)
    return [json.loads(line[22:]) for line in lines]


def test_each_request_is_logged_received_then_finished_as_sglang_does(logged):
    events = _events(logged)
    by_rid = {}
    for e in events:
        by_rid.setdefault(e.get("rid"), []).append(e["event"])
    for rid in ("ids", "text", "stream", "chat"):
        assert by_rid[rid] == [RECEIVED, FINISHED], rid
    (probe,) = [rid for rid in by_rid if rid and rid.startswith("HEALTH_CHECK_")]
    assert by_rid[probe] == [RECEIVED, FINISHED]
    # the chat payload, before it is rendered, no rid
    assert [e["event"] for e in events].count(OPENAI) == 1
    finished = {e["rid"]: e for e in events if e["event"] == FINISHED}
    assert (
        finished["text"]["obj"]["text"] == "hello there"
        and finished["text"]["obj"]["input_ids"] is None
    )
    # level >= 2 adds the prompt as text, as SGLang's logger
    assert finished["ids"]["obj"]["text"] is not None
    assert finished["chat"]["obj"]["input_ids"] and finished["ids"]["headers"] == {
        "x-smg-routing-key": "k"
    }
    for e in finished.values():
        assert (
            set(e["out"]) == {"text", "output_ids", "meta_info"}
            and e["out"]["meta_info"]["finish_reason"]
        )
    info = json.loads((logged / SERVER_INFO_FILE).read_text())
    assert info["log_requests_level"] == 3 and info["model_path"]


def test_the_served_reader_joins_every_request_of_the_log(logged):
    requests = [r for r in iter_log(log_files(logged)) if isinstance(r, ServedRequest)]
    assert sorted(r.rid for r in requests if not r.health_check) == [
        "chat",
        "ids",
        "stream",
        "text",
    ]
    stream = next(r for r in requests if r.rid == "stream")
    assert len(stream.output_ids) == stream.meta_info["completion_tokens"]


def _log(tmp_path: Path, level: int) -> RequestLog:
    args = argparse.Namespace(
        log_requests=True,
        log_requests_level=level,
        log_requests_format="json",
        log_requests_target=[str(tmp_path / f"level{level}")],
    )
    return RequestLog(args)


@pytest.mark.parametrize(
    ("level", "obj_keys", "out_keys"),
    [
        (0, {"rid", "stream"}, {"meta_info"}),
        (1, {"rid", "stream", "sampling_params"}, {"meta_info"}),
        (
            3,
            {"rid", "stream", "sampling_params", "text", "input_ids"},
            {"meta_info", "text", "output_ids"},
        ),
    ],
)
def test_lower_levels_drop_the_prompt_and_the_answer(
    tmp_path, monkeypatch, level, obj_keys, out_keys
):
    monkeypatch.setenv("SGLANG_LOG_REQUEST_HEADERS", "x-tenant")
    log = _log(tmp_path, level)
    req = GenerateRequest("r", [1, 2, 3], SamplingParams(max_new_tokens=4), False)
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}
    out = {"text": "ok", "output_ids": [9, 3], "meta_info": {"finish_reason": {"type": "stop"}}}
    log.received(body, req, {"x-tenant": "acme", "authorization": "secret"}, chat=False)
    log.finished(body, req, out, {}, chat=False)
    received, finished = _events(tmp_path / f"level{level}")
    assert set(received["obj"]) == obj_keys and set(finished["out"]) == out_keys
    assert received["headers"] == {"x-tenant": "acme"}  # only the headers SGLang is told to log


def test_level_two_cuts_long_lists_and_strings_as_sglang_does(tmp_path):
    log = _log(tmp_path, 2)
    ids = list(range(3000))
    req = GenerateRequest("r", ids, SamplingParams(max_new_tokens=4), False)
    log.received({"input_ids": ids}, req, {}, chat=False)
    (event,) = _events(tmp_path / "level2")
    logged = event["obj"]["input_ids"]
    assert (
        len(logged) == 2049
        and logged[1024] == "..."
        and logged[:3] == [0, 1, 2]
        and logged[-1] == 2999
    )
