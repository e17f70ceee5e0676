"""A reply that would run past the context: SGLang refuses the request (prompt + max_new_tokens >
context, 400), so the client asks only for the room the prompt leaves, and the reply stops at the
context as a truncated sample."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from eagle3.data.template import render_prompt
from eagle3.regen.stage import RegenStage
from eagle3.serve.launch import reference_server
from eagle3.stage import run_stage

CONTEXT = 96
# tokens the near prompt leaves: any answer but an empty one runs past it, whatever the target says
ROOM = 1


def _near_question(tokenizer) -> str:
    """A question whose rendered prompt leaves exactly ``ROOM`` tokens of the context."""
    words = ["apples"]
    while (
        len(render_prompt(tokenizer, [{"role": "user", "content": " ".join(words)}]))
        < CONTEXT - ROOM
    ):
        words.append("apples")
    question = " ".join(words)
    assert len(render_prompt(tokenizer, [{"role": "user", "content": question}])) == CONTEXT - ROOM
    return question


def test_a_reply_near_the_context_is_asked_for_the_room_left_and_a_full_prompt_fails_alone(
    tmp_path, regen_model_dir, regen_helpers, tiny_tokenizer
):
    short = regen_helpers.chat("short", "hi")
    near = regen_helpers.chat("near", _near_question(tiny_tokenizer))
    full = regen_helpers.chat("full", " ".join(["apples"] * 200))
    prompts = regen_helpers.write_prompts(tmp_path, [[short, near, full]])
    with reference_server(regen_model_dir, extra_args=["--context-length", str(CONTEXT)]) as server:
        config = regen_helpers.config(
            tmp_path,
            regen_model_dir,
            [server.url],
            max_new_tokens=80,
            keep_truncated=True,
            temperature=0.0,
        )
        config.target.context_length = CONTEXT
        summary = run_stage(RegenStage(), config, prompts_dir=prompts).summary
    out = Path(summary["regen_dir"])
    rows = {r["sample_id"]: r for r in pq.read_table(out / "shard-00000.parquet").to_pylist()}
    failed = {r["sample_id"]: r for r in pq.read_table(out / "failed-00000.parquet").to_pylist()}
    assert set(rows) == {"short", "near"} and set(failed) == {"full"}
    near_row = rows["near"]
    assert near_row["status"] == "truncated" and near_row["finish_reason"] == "length"
    # the room left
    assert (near_row["prompt_tokens"], near_row["completion_tokens"]) == (CONTEXT - ROOM, ROOM)
    assert "no room to generate" in failed["full"]["error"] and failed["full"]["attempts"] <= 1
