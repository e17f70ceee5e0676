"""kill -9 of the regen client in the middle of tool-calling conversations on the thinking world,
then restart: every conversation exactly once, and only the turns in flight are asked again (a
finished turn, tool call included, is replayed from the journal with the source's tool results)."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from eagle3.regen.journal import scan_journal
from eagle3.serve.launch import reference_server

CONCURRENCY = 3


def _mid_conversation(journal) -> set[str]:
    """Conversations with a finished turn and no finished row yet."""
    scan = scan_journal(journal)
    return {t["sample_id"] for t in scan.turns} - {r["sample_id"] for r in scan.rows}


@pytest.mark.slow
def test_a_kill_mid_conversation_redoes_only_the_turns_in_flight(
    tmp_path, think_world, regen_helpers
):
    model = think_world.model_dir
    request_log = tmp_path / "requests.log"
    extra = [
        "--num-threads",
        "1",
        "--request-log",
        str(request_log),
        "--fault-extra-latency",
        "0.3",
    ]
    rows = regen_helpers.agentic_rows(6, seed=77)
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    with reference_server(model, extra_args=extra) as server:
        settings = {
            "reasoning_parser": "kimi_k2",
            "tool_call_parser": "kimi_k2",
            "thinking": True,
            "max_new_tokens": 96,
            "concurrency_per_server": CONCURRENCY,
        }
        config = regen_helpers.config(
            tmp_path, model, [server.url], context_length=1024, **settings
        )
        run = regen_helpers.kill_and_resume(
            tmp_path, config, prompts, _mid_conversation, "no conversation got past its first turn"
        )
    assert len(run.at_kill.rows) < len(rows), "the kill came too late to test resume"
    regenerated = pq.read_table(run.out / "shard-00000.parquet").to_pylist()
    # each exactly once
    assert sorted(r["sample_id"] for r in regenerated) == sorted(r["sample_id"] for r in rows)
    turns = sum(json.loads(r["meta"])["turns"] for r in regenerated)
    # "<sample>:<turn>"
    completed = Counter(rid.rsplit("-a", 1)[0] for rid in request_log.read_text().split())
    redone = sum(completed.values()) - turns
    assert 0 <= redone <= CONCURRENCY, (
        f"{redone} turns redone, at most {CONCURRENCY} were in flight"
    )
    assert max(completed.values()) <= 2
    assert any(json.loads(r["meta"])["tool_results"] for r in regenerated), (
        "no tool result was replayed"
    )
