"""The reference server over real HTTP: SGLang shapes, batching, streaming, errors, faults,
synthetic mode."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from eagle3.serve.launch import reference_server
from eagle3.serve.reference.app import meta_info
from eagle3.serve.reference.args import parse_args, server_info
from eagle3.serve.reference.protocol import Completion

SERVER_ARGS = ["--num-threads", "1", "--max-running-requests", "8", "--context-length", "256"]


@pytest.fixture(scope="module")
def server(serve_model_dir: Path):
    with reference_server(serve_model_dir, extra_args=SERVER_ARGS) as srv:
        yield srv


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


def _run_posts(url: str, bodies: list[Any]) -> list[tuple[int, Any]]:
    async def go() -> list[tuple[int, Any]]:
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(*(_post(session, url, b) for b in bodies))

    return asyncio.run(go())


def _greedy(ids: list[int], n: int) -> dict[str, Any]:
    return {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
    }


def test_generate_answers_with_sglang_fields(server):
    [(status, body)] = _run_posts(
        f"{server.url}/generate", [_greedy([5, 6, 7, 8], 4) | {"rid": "r1"}]
    )
    assert status == 200
    assert len(body["output_ids"]) == 4 and isinstance(body["text"], str)
    meta = body["meta_info"]
    assert meta["id"] == "r1"
    assert meta["finish_reason"]["type"] == "length"
    counts = (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"])
    assert counts == (4, 4, 0)  # nothing cached yet
    assert "e2e_latency" in meta
    assert not {"spec_verify_ct", "spec_accept_length"} & set(meta)  # not a speculative server


def test_concurrent_greedy_requests_equal_each_alone(server):
    prompts = [[5 + (i * 7 + j) % 200 for j in range(3 + 4 * i)] for i in range(6)]
    alone = [
        _run_posts(f"{server.url}/generate", [_greedy(p, 5 + i)])[0] for i, p in enumerate(prompts)
    ]
    together = _run_posts(
        f"{server.url}/generate", [_greedy(p, 5 + i) for i, p in enumerate(prompts)]
    )
    assert [b["output_ids"] for _, b in together] == [b["output_ids"] for _, b in alone]


def test_a_seeded_sampled_request_gives_its_tokens_alone_and_among_others(server):
    def sampled(prompt: list[int], seed: int) -> dict:
        params = {"max_new_tokens": 12, "temperature": 1.0, "top_p": 0.95, "sampling_seed": seed}
        return {"input_ids": prompt, "sampling_params": params}

    prompts = [[5 + (i * 7 + j) % 200 for j in range(3 + 4 * i)] for i in range(4)]
    url = f"{server.url}/generate"
    alone = [_run_posts(url, [sampled(p, i)])[0] for i, p in enumerate(prompts)]
    together = _run_posts(url, [sampled(p, i) for i, p in enumerate(prompts)])
    reseeded = _run_posts(url, [sampled(p, 100 + i) for i, p in enumerate(prompts)])
    outputs = [b["output_ids"] for _, b in together]
    assert outputs == [b["output_ids"] for _, b in alone]
    assert outputs != [b["output_ids"] for _, b in reseeded]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input_ids": [1, 2, 10**9]}, "outside the vocabulary"),
        ({"input_ids": []}, "cannot be empty"),
        ({"input_ids": ["a", "b"]}, "integers"),
        ({"input_ids": [5] * 300}, "context length"),
        (
            {"input_ids": [5], "sampling_params": {"max_new_tokens": "x"}},
            'string "x", expected i64',
        ),
        ({"text": "hi", "input_ids": [5]}, "exactly one"),
        ([1, 2], "JSON object"),
        ({"input_ids": [5], "sampling_params": {"sampling_seed": 1.5}}, "`1.5`, expected i64"),
        ({"input_ids": [5], "sampling_params": {"sampling_seed": 2**64}}, "sampling_seed must be"),
    ],
)
def test_bad_input_answers_400_with_a_message(server, body, needle):
    [(status, reply)] = _run_posts(f"{server.url}/generate", [body])
    assert status == 400
    error = reply["error"]  # a sampling parameter that does not decode: SGLang's plain-string error
    assert needle in (error if isinstance(error, str) else error["message"])


def test_stream_sends_events_then_done(server):
    req = urllib.request.Request(
        f"{server.url}/generate",
        data=json.dumps(_greedy([5, 6, 7], 3) | {"stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        events = [e for e in resp.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    final = json.loads(events[-2].removeprefix("data: "))
    assert final["meta_info"]["finish_reason"]["type"] == "length"
    assert len(final["output_ids"]) == 3
    assert all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert not any("spec_verify_ct" in c["meta_info"] for c in chunks)  # not a speculative server


def test_chat_completions_renders_the_chat_template(server):
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "temperature": 0}
    [(status, reply)] = _run_posts(f"{server.url}/v1/chat/completions", [body])
    assert status == 200
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["usage"]["completion_tokens"] <= 3
    assert reply["usage"]["prompt_tokens"] > 3  # the template added the role markers


def test_info_endpoints_report_model_and_server_args(server, serve_model_dir):
    model = _get(f"{server.url}/model_info")
    assert model["model_path"] == str(serve_model_dir)
    assert model["architectures"] == ["LlamaForCausalLM"] and model["synthetic"] is False
    info = _get(f"{server.url}/server_info")
    assert info["speculative_algorithm"] is None
    assert info["max_running_requests"] == 8
    assert "avg_spec_accept_length" in info["internal_states"][0]
    # SGLang's deprecated aliases (entrypoints/http_server.py) answer the same payloads
    assert _get(f"{server.url}/get_model_info") == model
    alias = _get(f"{server.url}/get_server_info")
    assert {k: v for k, v in alias.items() if k != "internal_states"} == {
        k: v for k, v in info.items() if k != "internal_states"
    }
    with urllib.request.urlopen(f"{server.url}/health_generate", timeout=30) as resp:
        assert resp.status == 200


def test_speculative_flags_are_stored_in_server_args():
    args = parse_args(
        [
            "--model",
            "m",
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            "d",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
        ]
    )
    info = server_info(args)
    assert info["speculative_algorithm"] == "EAGLE3" and info["speculative_num_draft_tokens"] == 4
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--speculative-num-steps", "3"])  # all three or none


def test_synthetic_mode_faults_and_queue_cap():
    extra = [
        "--synthetic-tokens",
        "4",
        "--synthetic-delay",
        "0.3",
        "--fault-bad-request-every",
        "3",
        "--max-queued-requests",
        "2",
    ]
    with reference_server(None, extra_args=extra) as srv:
        assert _get(f"{srv.url}/model_info")["synthetic"] is True
        replies = _run_posts(f"{srv.url}/generate", [{"input_ids": [5, 6]}] * 6)
    statuses = sorted(s for s, _ in replies)
    assert statuses.count(400) == 2  # requests #3 and #6
    assert statuses.count(503) >= 1 and statuses.count(200) >= 1
    bad = [b for s, b in replies if s == 400]
    assert all("injected fault" in b["error"]["message"] for b in bad)


def test_crash_after_answers_n_requests_then_none_and_exits():
    """The next request is sent the moment the last reply arrives, inside the 50 ms before the exit:
    it must not be served (it was, in ~10 ms, on a fast machine, so "the server is gone after N"
    depended on the machine)."""

    async def go(url: str) -> list[tuple[int, Any] | str]:
        out: list[tuple[int, Any] | str] = []
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                try:
                    out.append(await _post(session, url, {"input_ids": [5]}))
                except aiohttp.ClientError as exc:
                    out.append(type(exc).__name__)
        return out

    with reference_server(
        None, extra_args=["--synthetic-tokens", "2", "--fault-crash-after", "2"]
    ) as srv:
        first, second, third = asyncio.run(go(f"{srv.url}/generate"))
        assert srv.wait(timeout_s=20) == 70
    assert first[0] == 200 and second[0] == 200
    assert isinstance(third, str)  # the connection dropped by the exit, no reply


async def _post_after(
    session: aiohttp.ClientSession, delay_s: float, url: str, body: Any
) -> tuple[int, Any]:
    await asyncio.sleep(delay_s)
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json(
            content_type=None
        ) if resp.content_type == "application/json" else None


def test_a_rid_in_flight_is_refused_like_sglang_and_free_again_once_done():
    """SGLang's ``TokenizerManager`` refuses a rid it is still serving: 400 ``Duplicate request ID
    detected: <rid>``."""
    with reference_server(
        None, extra_args=["--synthetic-tokens", "2", "--synthetic-delay", "0.8"]
    ) as srv:
        url, body = f"{srv.url}/generate", {"input_ids": [5, 6], "rid": "dup"}

        async def go() -> list[tuple[int, Any]]:
            async with aiohttp.ClientSession() as session:
                first = _post_after(session, 0.0, url, body)
                return list(await asyncio.gather(first, _post_after(session, 0.3, url, body)))

        (first, first_body), (second, second_body) = asyncio.run(go())
        assert first == 200 and first_body["meta_info"]["id"] == "dup"
        assert (
            second == 400
            and second_body["error"]["message"] == "Duplicate request ID detected: dup"
        )
        [(again, _)] = _run_posts(url, [body])  # finished: the rid may be used again
    assert again == 200


def _flush(url: str, method: str = "POST") -> tuple[int, str]:
    req = urllib.request.Request(f"{url}/flush_cache", method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_flush_cache_is_refused_while_requests_run_and_done_when_idle():
    """``/flush_cache``: 400 while anything runs or waits, 200 when idle (SGLang's
    ``http_server.flush_cache``)."""
    with reference_server(
        None, extra_args=["--synthetic-tokens", "2", "--synthetic-delay", "1.0"]
    ) as srv:

        async def go() -> tuple[tuple[int, str], tuple[int, Any]]:
            async with aiohttp.ClientSession() as session:
                running = asyncio.ensure_future(
                    _post_after(session, 0.0, f"{srv.url}/generate", {"input_ids": [5]})
                )
                await asyncio.sleep(0.3)
                busy = await asyncio.to_thread(_flush, srv.url)
                return busy, await running

        (busy, message), (status, _) = asyncio.run(go())
        assert status == 200
        assert (busy, message) == (400, "Flush cache failed.\n")
        assert _flush(srv.url)[0] == 200
        assert _flush(srv.url, "GET")[0] == 200


def test_speculative_counters_only_on_a_speculative_server_and_only_when_positive():
    """SGLang's ``TokenizerManager`` adds the ``spec_*`` counters for speculative requests only (3
    drafts a pass)."""
    done = Completion(
        "r",
        [5],
        [7, 8, 9, 10],
        {"type": "length", "length": 4},
        verify_ct=2,
        e2e_latency=0.1,
        accepted_drafts=[2, 0],
    )
    spec = meta_info(done, 1, drafts_per_pass=3)
    assert (spec["spec_verify_ct"], spec["spec_accept_length"], spec["cached_tokens"]) == (
        2,
        2.0,
        0,
    )
    counts = (
        spec["spec_num_correct_drafts"],
        spec["spec_num_proposed_drafts"],
        spec["spec_accept_rate"],
    )
    assert counts == (2, 6, 2 / 6)
    # one pass kept no draft, one kept two
    assert spec["spec_correct_drafts_histogram"] == [1, 0, 1, 0]
    plain = meta_info(done, 1, drafts_per_pass=None)
    assert not {k for k in plain if k.startswith("spec_")}
    no_pass = Completion("r", [5], [], {"type": "abort"}, verify_ct=0, e2e_latency=0.0)
    assert "spec_verify_ct" not in meta_info(no_pass, 1, drafts_per_pass=3)


def test_a_prompt_continuing_an_answered_one_reports_its_cached_prefix_until_a_flush(server):
    """Regen's next turn repeats the last turn's prompt and answer: served from the prefix cache,
    counted in ``cached_tokens`` as SGLang counts radix-cache hits; ``/flush_cache`` empties it."""
    prompt = [5 + (j * 11) % 200 for j in range(40)]
    [(_, first)] = _run_posts(f"{server.url}/generate", [_greedy(prompt, 4)])
    follow = [*prompt, *first["output_ids"], 7, 8, 9]
    [(_, hit)] = _run_posts(f"{server.url}/generate", [_greedy(follow, 3)])
    assert hit["meta_info"]["cached_tokens"] == len(prompt) + 3  # the last answer token not fed
    flushed = urllib.request.urlopen(f"{server.url}/flush_cache", timeout=30).read().decode()
    assert "Cache flushed" in flushed
    [(_, again)] = _run_posts(f"{server.url}/generate", [_greedy(follow, 3)])
    assert again["meta_info"]["cached_tokens"] == 0 and again["output_ids"] == hit["output_ids"]
