"""kill -9 of the regen client half way, then restart: every sample exactly once, only in-flight
requests redone, multi-turn samples included (their finished turns are journaled, so no finished
turn is asked again)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from eagle3.regen.journal import scan_journal
from eagle3.serve.launch import reference_server

N = 30
CONCURRENCY = 4
TURNS = [1 if i % 2 else 3 for i in range(N)]  # half the samples have three user turns


@pytest.mark.slow
def test_resume_after_kill_redoes_only_inflight_requests(tmp_path, regen_model_dir, regen_helpers):
    request_log = tmp_path / "requests.log"
    extra = [
        "--num-threads",
        "1",
        "--request-log",
        str(request_log),
        "--fault-extra-latency",
        "0.4",
    ]
    rows = [
        regen_helpers.chat(f"s{i:02d}", *[f"question {i}.{t}" for t in range(TURNS[i])])
        for i in range(N)
    ]
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    with reference_server(regen_model_dir, extra_args=extra) as server:
        config = regen_helpers.config(
            tmp_path, regen_model_dir, [server.url], concurrency_per_server=CONCURRENCY
        )
        run = regen_helpers.kill_and_resume(
            tmp_path,
            config,
            prompts,
            lambda journal: len(scan_journal(journal).good) >= sum(TURNS) // 2,
            "the client made no progress",  # half the turns journaled (a line per finished turn)
        )
    assert len(run.at_kill.rows) < N, "the kill came too late to test resume"
    assert {t["sample_id"] for t in run.at_kill.turns} - {
        r["sample_id"] for r in run.at_kill.rows
    }, "none mid-way"
    ids = (
        pq.read_table(run.out / "shard-00000.parquet", columns=["sample_id"])
        .column("sample_id")
        .to_pylist()
    )
    assert sorted(ids) == [f"s{i:02d}" for i in range(N)]  # every sample exactly once
    assert not run.journal.exists()
    completed = request_log.read_text().split()
    redone = len(completed) - sum(TURNS)
    assert 0 <= redone <= CONCURRENCY, (
        f"{redone} turns redone, at most {CONCURRENCY} were in flight"
    )
