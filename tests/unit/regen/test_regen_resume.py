"""kill -9 of the regen client half way, then restart: every sample exactly once, only in-flight requests redone,
multi-turn samples included (their finished turns are journaled, so no finished turn is asked again)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from eagle3.regen.journal import scan_journal
from eagle3.regen.plan import regen_fingerprint
from eagle3.rundir.layout import stage_dir
from eagle3.rundir.runroot import Manifest
from eagle3.serve.launch import reference_server

N = 30
CONCURRENCY = 4
TURNS = [1 if i % 2 else 3 for i in range(N)]  # half the samples have three user turns


@pytest.mark.slow
def test_resume_after_kill_redoes_only_inflight_requests(tmp_path, regen_model_dir, regen_helpers):
    request_log = tmp_path / "requests.log"
    extra = ["--num-threads", "1", "--request-log", str(request_log), "--fault-extra-latency", "0.4"]
    rows = [regen_helpers.chat(f"s{i:02d}", *[f"question {i}.{t}" for t in range(TURNS[i])]) for i in range(N)]
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    with reference_server(regen_model_dir, extra_args=extra) as server:
        config = regen_helpers.config(tmp_path, regen_model_dir, [server.url], concurrency_per_server=CONCURRENCY)
        config_path = tmp_path / "config.yaml"
        config_path.write_text(config.to_yaml())
        out = stage_dir(tmp_path, "regen", regen_fingerprint(Manifest.read(prompts).fingerprint, config))
        journal = out / "shard-00000.journal.jsonl"
        cmd = [sys.executable, "-m", "eagle3.regen", "--config", str(config_path), "--prompts", str(prompts)]
        with open(tmp_path / "client1.log", "wb") as log:
            first = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while len(scan_journal(journal).good) < sum(TURNS) // 2:  # a line per finished turn
            assert first.poll() is None, (tmp_path / "client1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the client made no progress"
            time.sleep(0.05)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        at_kill = scan_journal(journal)
        assert len(at_kill.rows) < N, "the kill came too late to test resume"
        assert {t["sample_id"] for t in at_kill.turns} - {r["sample_id"] for r in at_kill.rows}, "no sample mid-way"
        second = subprocess.run(cmd, capture_output=True, timeout=600)
        assert second.returncode == 0, second.stderr.decode()[-3000:]
    ids = pq.read_table(out / "shard-00000.parquet", columns=["sample_id"]).column("sample_id").to_pylist()
    assert sorted(ids) == [f"s{i:02d}" for i in range(N)]  # every sample exactly once
    assert not journal.exists()
    completed = request_log.read_text().split()
    redone = len(completed) - sum(TURNS)
    assert 0 <= redone <= CONCURRENCY, f"{redone} turns redone, at most {CONCURRENCY} were in flight"
