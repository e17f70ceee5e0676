"""End to end through the reference server: every prompt regenerated, ids stored exactly as sent and
received."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from eagle3.data.template import render_conversation, render_prompt
from eagle3.regen.conversation import round_trips
from eagle3.regen.plan import regen_fingerprint
from eagle3.regen.stage import RegenStage
from eagle3.rundir.runroot import Manifest
from eagle3.serve.launch import is_healthy, reference_server
from eagle3.stage import UnitsFailed, run_stage


@pytest.fixture(scope="module")
def server(regen_model_dir: Path):
    with reference_server(
        regen_model_dir, extra_args=["--num-threads", "1", "--max-running-requests", "8"]
    ) as srv:
        yield srv


def _prompts(h) -> list[list[dict]]:
    shard0 = [h.chat(f"s{i}", f"question number {i} about topic {i % 3}") for i in range(5)]
    shard0.append(h.chat("multi", "first question", "second question", system="be brief"))
    shard1 = [h.chat(f"t{i}", f"another question {i}") for i in range(3)]
    shard1.append(
        {
            "sample_id": "pretok",
            "messages": [],
            "input_ids": [5, 6, 7, 8],
            "loss_mask": [0, 0, 1, 1],
        }
    )
    return [shard0, shard1]


def _server_greedy(url: str, ids: list[int], n: int) -> list[int]:
    async def go() -> list[int]:
        body = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "top_p": 1.0},
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/generate", json=body) as resp,
        ):
            return (await resp.json())["output_ids"]

    return asyncio.run(go())


def test_every_prompt_regenerated_with_sent_prompt_ids_and_received_output_ids(
    tmp_path, regen_model_dir, server, regen_helpers
):
    prompts = regen_helpers.write_prompts(tmp_path, _prompts(regen_helpers))
    config = regen_helpers.config(tmp_path, regen_model_dir, [server.url])
    summary = run_stage(RegenStage(), config, prompts_dir=prompts).summary
    assert summary["done"] and summary["failed_shards"] == []
    out = Path(summary["regen_dir"])
    assert out.name == regen_fingerprint(Manifest.read(prompts).fingerprint, config)
    rows = (
        pq.read_table(out / "shard-00000.parquet").to_pylist()
        + pq.read_table(out / "shard-00001.parquet").to_pylist()
    )
    assert sorted(r["sample_id"] for r in rows) == sorted(
        r["sample_id"] for s in _prompts(regen_helpers) for r in s
    )
    tok = AutoTokenizer.from_pretrained(regen_model_dir)
    for row in rows:
        if row["sample_id"] == "pretok":
            assert (row["input_ids"], row["loss_mask"], row["server"]) == (
                [5, 6, 7, 8],
                [0, 0, 1, 1],
                "pretokenized",
            )
            continue
        history, reply = row["messages"][:-1], row["messages"][-1]
        assert reply["role"] == "assistant" and "ORIGINAL ANSWER" not in json.dumps(row["messages"])
        prompt, output = (
            row["input_ids"][: row["prompt_tokens"]],
            row["input_ids"][row["prompt_tokens"] :],
        )
        assert prompt == render_prompt(tok, history)
        assert output == _server_greedy(server.url, prompt, 6), (
            "output ids are not the server's ids as received"
        )
        assert len(output) == row["completion_tokens"] and row["status"] in ("ok", "truncated")
        expected = render_conversation(tok, history).loss_mask if len(history) > 1 else []
        expected = expected + [0] * (len(prompt) - len(expected)) + [1] * len(output)
        assert row["loss_mask"] == expected
        if len(history) <= 2:  # one regenerated turn: the stored output is the only one checked
            assert json.loads(row["meta"])["round_trip"] == round_trips(tok, output)
    multi = next(r for r in rows if r["sample_id"] == "multi")
    assert [m["role"] for m in multi["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    # the regenerated first answer is trained on
    assert sum(multi["loss_mask"][: multi["prompt_tokens"]]) > 0
    manifest = Manifest.read(out)
    assert manifest is not None and manifest.verify(out) == []
    assert manifest.stats["round_trip_failures"] == sum(
        not json.loads(r["meta"])["round_trip"] for r in rows
    )
    assert manifest.config["sampling_params"]["max_new_tokens"] == 6


def test_without_servers_a_local_reference_server_runs_for_the_stage_and_truncated_rows_can_be_dropped(
    tmp_path, regen_model_dir, regen_helpers
):
    prompts = regen_helpers.write_prompts(
        tmp_path, [[regen_helpers.chat("a", "hello"), regen_helpers.chat("b", "hi")]]
    )
    config = regen_helpers.config(
        tmp_path, regen_model_dir, [], max_new_tokens=1, keep_truncated=False
    )
    summary = run_stage(RegenStage(), config, prompts_dir=prompts).summary
    out = Path(summary["regen_dir"])
    kept = pq.read_table(out / "shard-00000.parquet").num_rows
    assert kept + summary["dropped"] == 2 and summary["truncated"] == 0
    # set aside with id and text, not lost
    dropped = pq.read_table(out / "dropped-00000.parquet").to_pylist()
    assert len(dropped) == summary["dropped"] > 0 and {r["status"] for r in dropped} == {
        "truncated"
    }
    assert all(r["messages"] for r in dropped)
    manifest = Manifest.read(out)
    assert manifest.verify(out) == [] and "dropped-00000.parquet" in {
        f.path for f in manifest.files
    }
    log = (out / "reference-server.log").read_text()
    url = re.search(r"reference server on (http://\S+)", log).group(1)
    assert not is_healthy(url), "the stage's reference server is still running"


def test_a_damaged_prompts_shard_is_refused_by_name_before_any_request(
    tmp_path, regen_model_dir, regen_helpers
):
    prompts = regen_helpers.write_prompts(tmp_path, [[regen_helpers.chat("a", "hello")]])
    shard = prompts / "shard-00000.parquet"
    data = bytearray(shard.read_bytes())
    data[8:16] = b"\xff" * 8  # inside the first column chunk: the footer still reads
    shard.write_bytes(bytes(data))
    config = regen_helpers.config(tmp_path, regen_model_dir, ["http://127.0.0.1:9"])  # never asked
    with pytest.raises(UnitsFailed, match=r"shard-00000\.parquet: sha256 differs") as refused:
        run_stage(RegenStage(), config, prompts_dir=prompts)
    # normalize redoes all or nothing, once its manifest is gone: the fix says so
    assert f"then run `rm {prompts / 'manifest.json'} && eagle3 normalize`" in str(refused.value)
    assert not list((tmp_path / "regen").glob("*/shard-*.journal.jsonl")), "a sample was sent"


def test_openai_path_records_that_output_ids_are_retokenized(
    tmp_path, regen_model_dir, server, regen_helpers
):
    prompts = regen_helpers.write_prompts(
        tmp_path, [[regen_helpers.chat("o1", "hello"), regen_helpers.chat("o2", "hi")]]
    )
    config = regen_helpers.config(tmp_path, regen_model_dir, [server.url], api="openai")
    summary = run_stage(RegenStage(), config, prompts_dir=prompts).summary
    tok = AutoTokenizer.from_pretrained(regen_model_dir)
    for row in pq.read_table(Path(summary["regen_dir"]) / "shard-00000.parquet").to_pylist():
        meta = json.loads(row["meta"])
        assert (
            meta["api"] == "openai"
            and meta["retokenized"] is True
            and "re-tokenized" in meta["caveat"]
        )
        output = row["input_ids"][row["prompt_tokens"] :]
        text_ids = tok(row["messages"][-1]["content"], add_special_tokens=False)["input_ids"]
        assert output[: len(text_ids)] == text_ids


def test_max_turns_regenerates_the_first_turns_only_and_says_how_many_were_cut(
    tmp_path, regen_model_dir, server, regen_helpers
):
    rows = [regen_helpers.chat("three", "first question", "second question", "third question")]
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    config = regen_helpers.config(tmp_path, regen_model_dir, [server.url], max_turns=1)
    out = Path(run_stage(RegenStage(), config, prompts_dir=prompts).summary["regen_dir"])
    row = pq.read_table(out / "shard-00000.parquet").to_pylist()[0]
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
    assert row["messages"][0]["content"] == "first question"
    assert json.loads(row["meta"])["turns_cut"] == 2
    every = regen_helpers.config(tmp_path, regen_model_dir, [server.url])
    assert regen_fingerprint("p", config) != regen_fingerprint("p", every)  # another set of rows


def test_source_answers_are_kept_and_rendered_without_any_server(
    tmp_path, regen_model_dir, regen_helpers
):
    """regen.answers=source: the dataset's own answers, as the target's template renders them, the
    loss on them."""
    two = regen_helpers.chat("two", "first question", "second question")
    rows = [two, regen_helpers.chat("one", "hi")]
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    config = regen_helpers.config(tmp_path, regen_model_dir, [], answers="source", max_turns=1)
    out = Path(run_stage(RegenStage(), config, prompts_dir=prompts).summary["regen_dir"])
    got = {r["sample_id"]: r for r in pq.read_table(out / "shard-00000.parquet").to_pylist()}
    assert not list(out.glob("*-server.log"))  # no server was started
    two = got["two"]
    rendered = render_conversation(AutoTokenizer.from_pretrained(regen_model_dir), two["messages"])
    assert (two["input_ids"], two["loss_mask"]) == (rendered.input_ids, rendered.loss_mask)
    assert [m["content"] for m in two["messages"]] == ["first question", "ORIGINAL ANSWER 0"]
    assert json.loads(two["meta"])["turns_cut"] == 1 and two["server"] == "source"
    assert two["completion_tokens"] == sum(two["loss_mask"]) > 0
