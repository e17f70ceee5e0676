"""kill -9 of the regen client in the middle of tool-calling conversations on the thinking world, then restart:
every conversation exactly once, and only the turns in flight are asked again (a finished turn, tool call included,
is replayed from the journal with the source's tool results)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest

from eagle3.regen.journal import scan_journal
from eagle3.regen.plan import regen_fingerprint
from eagle3.rundir.layout import stage_dir
from eagle3.rundir.runroot import Manifest
from eagle3.serve.launch import reference_server

CONCURRENCY = 3


def _mid_conversation(journal) -> set[str]:
    """Conversations with a finished turn and no finished row yet."""
    scan = scan_journal(journal)
    return {t["sample_id"] for t in scan.turns} - {r["sample_id"] for r in scan.rows}


@pytest.mark.slow
def test_a_kill_mid_conversation_redoes_only_the_turns_in_flight(tmp_path, think_world, regen_helpers):
    model = think_world.model_dir
    request_log = tmp_path / "requests.log"
    extra = ["--num-threads", "1", "--request-log", str(request_log), "--fault-extra-latency", "0.3"]
    rows = regen_helpers.agentic_rows(6, seed=77)
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    with reference_server(model, extra_args=extra) as server:
        settings = {"reasoning_parser": "kimi_k2", "tool_call_parser": "kimi_k2", "thinking": True,
                    "max_new_tokens": 96, "concurrency_per_server": CONCURRENCY}  # fmt: skip
        config = regen_helpers.config(tmp_path, model, [server.url], context_length=1024, **settings)
        config_path = tmp_path / "config.yaml"
        config_path.write_text(config.to_yaml())
        out = stage_dir(tmp_path, "regen", regen_fingerprint(Manifest.read(prompts).fingerprint, config))
        journal = out / "shard-00000.journal.jsonl"
        cmd = [sys.executable, "-m", "eagle3.regen", "--config", str(config_path), "--prompts", str(prompts)]
        with open(tmp_path / "client1.log", "wb") as log:
            first = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while not _mid_conversation(journal):
            assert first.poll() is None, (tmp_path / "client1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no conversation got past its first turn"
            time.sleep(0.05)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        at_kill = scan_journal(journal)
        assert len(at_kill.rows) < len(rows), "the kill came too late to test resume"
        second = subprocess.run(cmd, capture_output=True, timeout=600)
        assert second.returncode == 0, second.stderr.decode()[-3000:]
    regenerated = pq.read_table(out / "shard-00000.parquet").to_pylist()
    assert sorted(r["sample_id"] for r in regenerated) == sorted(r["sample_id"] for r in rows)  # each exactly once
    turns = sum(json.loads(r["meta"])["turns"] for r in regenerated)
    completed = Counter(rid.rsplit("-a", 1)[0] for rid in request_log.read_text().split())  # "<sample>:<turn>"
    redone = sum(completed.values()) - turns
    assert 0 <= redone <= CONCURRENCY, f"{redone} turns redone, at most {CONCURRENCY} were in flight"
    assert max(completed.values()) <= 2
    assert any(json.loads(r["meta"])["tool_results"] for r in regenerated), "no tool result was replayed"
