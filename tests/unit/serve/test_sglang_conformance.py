"""The reference server against real SGLang 0.5.23, same tiny target, same requests: what keeps the
stand-in honest.

Every case the reference server models is sent to both servers, started from one config through the
one launcher (``build_launch``, engines ``reference`` and ``sglang``); status codes, error bodies,
``meta_info`` keys and greedy output ids must agree. Where they still differ on purpose,
docs/ARCHITECTURE.md ("The engines") says why it does not matter; such cases are not sent here (an
out-of-vocabulary id or an empty prompt kills SGLang 0.5.23's CPU scheduler).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from safetensors.torch import save_file

from eagle3.data.template import render_prompt
from eagle3.model.draft import DraftConfig, DraftModel
from eagle3.model.export_format import export_config, validate_export
from eagle3.recipes import load_recipe
from eagle3.serve.launch_commands import build_launch

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

CONTEXT = 1024
PROMPT = [1, 20, 30, 40, 50, 60, 70]
BAD_REQUESTS: dict[str, dict[str, Any]] = {
    "negative temperature": {"input_ids": PROMPT, "sampling_params": {"temperature": -1}},
    "top_p 0": {"input_ids": PROMPT, "sampling_params": {"top_p": 0}},
    "top_k 0": {"input_ids": PROMPT, "sampling_params": {"top_k": 0}},
    "negative max_new_tokens": {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": -1}},
    "unknown sampling field": {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": 4, "bogus": 1},
    },
    "max_new_tokens of the wrong type": {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": "x"},
    },
    "temperature of the wrong type": {
        "input_ids": PROMPT,
        "sampling_params": {"temperature": "hot"},
    },
    "stop of the wrong type": {"input_ids": PROMPT, "sampling_params": {"stop": 3}},
    "stream of the wrong type": {"input_ids": PROMPT, "stream": "yes"},
    "prompt over the context length": {
        "input_ids": [5] * (CONTEXT + 76),
        "sampling_params": {"max_new_tokens": 4},
    },
    "prompt + max_new_tokens over the context": {
        "input_ids": [5] * 1000,
        "sampling_params": {"max_new_tokens": 100},
    },
    "no prompt": {"sampling_params": {"max_new_tokens": 4}},
    "empty input_ids": {"input_ids": [], "sampling_params": {"max_new_tokens": 4}},
    "duplicate rid in one batch": {"input_ids": [PROMPT, PROMPT], "rid": ["x1", "x1"]},
}


def _request(url: str, path: str, body: Any = None, method: str = "POST") -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url + path, data=data, headers={"Content-Type": "application/json"}, method=method
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    logs = tmp_path_factory.mktemp("conformance")
    return load_recipe(
        "tiny",
        [
            f"root={logs / 'run'}",
            f"server.context_length={CONTEXT}",
            "server.max_running_requests=8",
        ],
    )


@pytest.fixture(scope="module")
def request_logs(tmp_path_factory) -> dict[str, Path]:
    """Where each engine logs its requests (``server.log_requests``: SGLang's request logging,
    level 3, JSON)."""
    return {engine: tmp_path_factory.mktemp(f"{engine}-logs") for engine in ("sglang", "reference")}


@pytest.fixture(scope="module")
def servers(sglang_python, tiny_world, config, request_logs, tmp_path_factory):
    """Real SGLang (the baseline arm on this CPU) and the reference server, both from the tiny
    recipe, each logging its requests."""
    logs = tmp_path_factory.mktemp("conformance")

    def launch(engine: str):
        server = config.server.replace(log_requests=str(request_logs[engine]))
        command = build_launch(config.replace(server=server), "baseline", engine=engine, port=0)
        return command.server(log_path=logs / f"{engine}.log")

    sglang, reference = launch("sglang"), launch("reference")
    with sglang, reference:
        yield {"sglang": sglang.url, "reference": reference.url}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_bad_request_gets_sglangs_status_and_error_body(servers, case):
    answers = {
        name: _request(url, "/generate", BAD_REQUESTS[case]) for name, url in servers.items()
    }
    status, body = answers["sglang"]
    assert status == 400, answers
    assert answers["reference"][0] == status
    assert json.loads(answers["reference"][1]) == json.loads(body)


def test_greedy_answers_have_the_same_output_ids_and_meta_info_keys(servers, tiny_tokenizer):
    prompts = [
        render_prompt(tiny_tokenizer, [{"role": "user", "content": q}])
        for q in (
            "Hello there",
            "What is 12 + 7? Explain briefly.",
            "Write a short poem about rain.",
        )
    ]
    answers = {}
    for name, url in servers.items():
        answers[name] = [
            json.loads(
                _request(
                    url,
                    "/generate",
                    {"input_ids": ids, "sampling_params": {"max_new_tokens": 48, "temperature": 0}},
                )[1]
            )
            for ids in prompts
        ]
    assert [a["output_ids"] for a in answers["reference"]] == [
        a["output_ids"] for a in answers["sglang"]
    ]
    assert [a["text"] for a in answers["reference"]] == [a["text"] for a in answers["sglang"]]
    for ref, real in zip(answers["reference"], answers["sglang"], strict=True):
        assert set(ref["meta_info"]) == set(real["meta_info"])
        assert ref["meta_info"]["finish_reason"] == real["meta_info"]["finish_reason"]


def test_max_new_tokens_zero_answers_at_once_with_nothing(servers):
    for url in servers.values():
        status, body = _request(
            url, "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 0}}
        )
        reply = json.loads(body)
        assert (status, reply["output_ids"], reply["meta_info"]["finish_reason"]) == (
            200,
            [],
            {"type": "length", "length": 0},
        )


async def _same_rid_twice(url: str) -> list[tuple[int, str]]:
    body = {
        "input_ids": PROMPT,
        "rid": "same",
        "sampling_params": {"max_new_tokens": 200, "ignore_eos": True},
    }
    async with aiohttp.ClientSession() as session:

        async def post() -> tuple[int, str]:
            async with session.post(f"{url}/generate", json=body) as resp:
                return resp.status, await resp.text()

        return list(await asyncio.gather(post(), post()))


def test_a_rid_in_flight_is_refused_and_free_again_once_done(servers):
    for url in servers.values():
        answers = sorted(asyncio.run(_same_rid_twice(url)))
        assert [status for status, _ in answers] == [200, 400]
        assert json.loads(answers[1][1]) == {
            "error": {"message": "Duplicate request ID detected: same"}
        }
        assert _request(url, "/generate", {"input_ids": PROMPT, "rid": "same"})[0] == 200


async def _flush_while_busy(url: str) -> tuple[tuple[int, str], tuple[int, str]]:
    """Flushes once the first streamed token proves the request runs; the rest of the context is
    still to generate.

    The request fills the context (ignore_eos), so the flush, sent the moment the first token
    arrives, lands about a thousand decode steps before the request can end, on however fast a
    machine; a fixed sleep did not (the reference server finished 300 tokens within it on a fast CI
    machine)."""
    body = {
        "input_ids": PROMPT,
        "stream": True,
        "sampling_params": {"max_new_tokens": CONTEXT - len(PROMPT), "ignore_eos": True},
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/generate", json=body) as resp,
    ):
        while not (await resp.content.readline()).startswith(b"data: {"):
            pass
        busy = await asyncio.to_thread(_request, url, "/flush_cache")
        await resp.read()
        return busy, (resp.status, "")


def test_flush_cache_is_refused_while_busy_and_done_when_idle_with_sglangs_texts(servers):
    answers = {name: asyncio.run(_flush_while_busy(url)) for name, url in servers.items()}
    idle = {name: _request(url, "/flush_cache") for name, url in servers.items()}
    assert answers["sglang"][0] == answers["reference"][0] == (400, "Flush cache failed.\n")
    assert answers["sglang"][1][0] == answers["reference"][1][0] == 200
    assert idle["sglang"] == idle["reference"] and idle["sglang"][0] == 200


def _untrained_draft(model_dir: Path, out: Path) -> Path:
    """An EAGLE-3 export of random weights for the tiny target: what is checked here is structure,
    not speed."""
    from transformers import AutoConfig

    torch.manual_seed(0)
    target = AutoConfig.from_pretrained(model_dir)
    cfg = DraftConfig.from_target_config(target, draft_vocab_size=target.vocab_size)
    out.mkdir()
    # the draft's vocab is the target's, so the export carries no d2t/t2d maps
    save_file(DraftModel(cfg).state_dict(), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(export_config(cfg, [1, 3, 4], dtype="float32")))
    assert validate_export(out) == []
    return out


async def _concurrently(url: str, prompts: list[list[int]]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as session:

        async def post(ids: list[int]) -> dict[str, Any]:
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 48, "temperature": 0}}
            async with session.post(f"{url}/generate", json=body) as resp:
                assert resp.status == 200, await resp.text()
                return await resp.json()

        return list(await asyncio.gather(*(post(ids) for ids in prompts)))


def test_the_speculative_reference_server_verifies_concurrent_requests_in_shared_target_forwards(
    servers, config, tiny_world, tiny_tokenizer, tmp_path
):
    """SGLang verifies the drafts of every running request in one target forward; the reference
    server counts its batched verify forwards and the per-request passes they served in
    ``/server_info``'s ``internal_states``."""
    questions = (
        "Hello there",
        "What is 12 + 7?",
        "Write a short poem about rain.",
        "Name three colours.",
    )
    prompts = [render_prompt(tiny_tokenizer, [{"role": "user", "content": q}]) for q in questions]
    draft = _untrained_draft(Path(tiny_world.model_dir), tmp_path / "draft")
    command = build_launch(config, "eagle3", engine="reference", draft=draft, port=0)
    with command.server(log_path=tmp_path / "reference-eagle3.log") as spec:
        answers = asyncio.run(_concurrently(spec.url, prompts))
        state = json.loads(_request(spec.url, "/server_info", method="GET")[1])["internal_states"][
            0
        ]
    plain = asyncio.run(_concurrently(servers["sglang"], prompts))  # real SGLang's greedy answers
    assert [a["output_ids"] for a in answers] == [a["output_ids"] for a in plain]
    assert state["verify_passes"] == sum(a["meta_info"]["spec_verify_ct"] for a in answers)
    # one forward served several requests
    assert state["verify_forwards"] < state["verify_passes"], state


def _served_rows(config, logs: Path, rids: set[str]) -> dict[str, tuple]:
    from eagle3.data.adapters import RowError
    from eagle3.data.served import ServedReader, served_tokenizer
    from eagle3.data.served_log import log_files

    reader = ServedReader.open(config, log_files(logs), served_tokenizer(config))
    rows, reasons = {}, {}
    for raw in reader.rows():
        try:
            conv = reader.convert(raw)
        except RowError as err:
            reasons[raw.value.rid if raw.error is None else raw.index] = err.reason
            continue
        rid = conv.meta["served"]["rid"]
        if rid in rids:
            rows[rid] = (conv.messages, conv.input_ids, conv.loss_mask)
    return rows | {"reasons": reasons}


def test_request_logs_written_by_sglang_and_by_the_reference_server_give_the_same_rows(
    servers, config, request_logs, tiny_tokenizer
):
    """The same served traffic (chat requests the server renders, ``/generate`` requests the
    client rendered, a health probe) logged by both engines with SGLang's request logging reads
    back as the same training rows."""
    from eagle3.data.served_log import SERVER_INFO_FILE

    conversations = [
        [{"role": "user", "content": "What is 12 + 7? Explain briefly."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}],
    ]
    for name, url in servers.items():
        for i, messages in enumerate(conversations):
            chat = {
                "rid": f"served-chat-{i}",
                "messages": messages,
                "max_tokens": 64,
                "temperature": 0,
            }
            assert _request(url, "/v1/chat/completions", chat)[0] == 200, name
            ids = render_prompt(tiny_tokenizer, messages)
            body = {
                "rid": f"served-ids-{i}",
                "input_ids": ids,
                "sampling_params": {"max_new_tokens": 64, "temperature": 0},
            }
            assert _request(url, "/generate", body)[0] == 200, name
        assert _request(url, "/health_generate", method="GET")[0] == 200
    rids = {f"served-{kind}-{i}" for kind in ("chat", "ids") for i in range(2)}
    rows = {name: _served_rows(config, request_logs[name], rids) for name in servers}
    reasons = {name: rows[name].pop("reasons") for name in servers}
    assert set(rows["sglang"]) == rids and rows["sglang"] == rows["reference"]
    assert rows["sglang"]["served-chat-1"][0][0] == {"role": "system", "content": "Be brief."}
    for name in servers:
        # the probes are in both logs, never rows
        assert "health_check" in reasons[name].values(), name
        info = json.loads((request_logs[name] / SERVER_INFO_FILE).read_text())
        assert Path(info["model_path"]) == Path(config.target.model_path)
