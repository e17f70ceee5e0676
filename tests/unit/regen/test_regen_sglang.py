"""Regen against real SGLang 0.5.23 on this CPU: the server killed with ``kill -9`` (its whole
process group) mid-run and started again; every sample is written once, and no rid ever reaches
SGLang twice (its own request log says)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eagle3.recipes import load_recipe
from eagle3.regen.journal import read_journal
from eagle3.regen.plan import regen_dir_for
from eagle3.regen.shard import waiting_name
from eagle3.regen.stage import RegenStage
from eagle3.runtime.procs import free_port
from eagle3.serve.launch_commands import build_launch
from eagle3.stage import run_stage

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

SAMPLES, KILL_AFTER_TURNS = 16, 6
RID = re.compile(r'"rid": "([^"]+)"')


def _served_rids(*logs: Path) -> list[str]:
    """The rid of every regen request SGLang received (``--log-requests --log-requests-format
    json``: one record per request, its rid first; SGLang's own warm-up and health checks left
    out)."""
    rids = [
        RID.search(line)
        for log in logs
        for line in log.read_text().splitlines()
        if "request.received" in line
    ]
    return [m.group(1) for m in rids if m and ":" in m.group(1)]


def test_kill_9_of_sglang_mid_run_then_a_restart_loses_and_duplicates_nothing(
    tmp_path, regen_model_dir, regen_helpers, sglang_python
):
    rows = [
        regen_helpers.chat(f"s{i}", f"question {i} about cookies", f"and why {i}?")
        for i in range(SAMPLES)
    ]
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    port = free_port()
    config = load_recipe(
        "tiny",
        [
            f"root={tmp_path / 'run'}",
            "server.engine=sglang",
            f"server.port={port}",
            "server.extra_args=[--log-requests, --log-requests-format, json]",
        ],
    )
    regen = regen_helpers.config(
        tmp_path,
        regen_model_dir,
        [f"http://127.0.0.1:{port}"],
        max_new_tokens=24,
        concurrency_per_server=4,
        max_retries=1,
        eject_after_failures=1,
        no_server_timeout_s=900,
        request_timeout_s=300,
    )
    out = regen_dir_for(regen, prompts)
    command = build_launch(config, "baseline")
    logs = [tmp_path / "sglang-1.log", tmp_path / "sglang-2.log"]
    finished, killed = threading.Event(), threading.Event()

    # the restarted server lives as long as this thread (die_with_parent)
    def kill_then_restart() -> None:
        deadline = time.monotonic() + 600
        journal = out / "shard-00000.journal.jsonl"
        while (
            time.monotonic() < deadline
            and len(read_journal(journal) if journal.exists() else []) < KILL_AFTER_TURNS
        ):
            time.sleep(0.2)
        # the launcher, SGLang's scheduler and detokenizer at once
        os.killpg(first.pid, signal.SIGKILL)
        killed.set()
        while not (out / waiting_name(0)).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        with command.server(log_path=logs[1]):
            finished.wait()

    restarter = threading.Thread(target=kill_then_restart)
    first = command.server(log_path=logs[0])
    try:
        with first:
            restarter.start()
            summary = run_stage(RegenStage(), regen, prompts_dir=prompts).summary
    finally:
        finished.set()
        restarter.join()
    assert killed.is_set() and summary["done"] and summary["failed"] == 0
    written = pq.read_table(out / "shard-00000.parquet").to_pylist()
    # each once
    assert sorted(r["sample_id"] for r in written) == sorted(r["sample_id"] for r in rows)
    assert all(r["status"] in ("ok", "truncated") for r in written)
    served = _served_rids(*logs)
    assert len(served) == len(set(served)), "a rid reached SGLang twice"
    assert {rid.rsplit("-a", 1)[0] for rid in served} >= {
        f"s{i}:{t}" for i in range(SAMPLES) for t in (0, 1)
    }
    # the requests cut by the kill were redone, under new rids
    assert any(rid.endswith("-a2") for rid in served)
