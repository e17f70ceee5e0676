"""Server faults through real (synthetic-mode) reference servers: retries, ejection, 400s, a server
gone, no server for longer than ``regen.no_server_timeout_s``, SIGTERM while waiting for one."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eagle3.regen.client import attempt_rid, classify
from eagle3.regen.journal import read_journal
from eagle3.regen.plan import regen_dir_for
from eagle3.regen.shard import waiting_name
from eagle3.regen.stage import RegenStage
from eagle3.regen.status import regen_status
from eagle3.rundir.layout import StageInputError
from eagle3.rundir.runroot import Manifest
from eagle3.runtime.procs import free_port
from eagle3.serve.launch import ServerProcess, reference_server
from eagle3.stage import UnitsFailed, run_stage

SYNTH = ["--synthetic-tokens", "4", "--synthetic-delay", "0.01"]


def _ids(directory: Path, prefix: str = "shard") -> list[str]:
    return [
        sid
        for path in sorted(directory.glob(f"{prefix}-*.parquet"))
        for sid in pq.read_table(path, columns=["sample_id"]).column("sample_id").to_pylist()
    ]


def test_two_servers_one_down_one_failing_completes_with_nothing_lost(
    tmp_path, regen_model_dir, regen_helpers
):
    shards = [
        [regen_helpers.chat(f"{s}-{i}", f"question {s} {i}") for i in range(15)] for s in range(2)
    ]
    prompts = regen_helpers.write_prompts(tmp_path, shards)
    dead = f"http://127.0.0.1:{free_port()}"
    with reference_server(
        None, extra_args=[*SYNTH, "--fault-fail-rate", "0.2", "--fault-seed", "1"]
    ) as flaky:
        config = regen_helpers.config(
            tmp_path,
            regen_model_dir,
            [dead, flaky.url],
            max_retries=8,
            eject_after_failures=2,
            readmit_after_s=0.5,
        )
        summary = run_stage(RegenStage(), config, prompts_dir=prompts).summary
    assert summary["done"] and summary["failed"] == 0 and summary["failed_shards"] == []
    out = Path(summary["regen_dir"])
    assert sorted(_ids(out)) == sorted(r["sample_id"] for s in shards for r in s)
    servers = {
        r["server"] for p in out.glob("shard-*.parquet") for r in pq.read_table(p).to_pylist()
    }
    assert servers == {flaky.url}
    attempts = [
        r["attempts"] for p in out.glob("shard-*.parquet") for r in pq.read_table(p).to_pylist()
    ]
    assert max(attempts) > 1  # some requests were retried


def test_injected_400s_end_as_failed_samples_with_the_server_message(
    tmp_path, regen_model_dir, regen_helpers
):
    rows = [regen_helpers.chat(f"q{i}", f"question {i}") for i in range(12)]
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    with reference_server(None, extra_args=[*SYNTH, "--fault-bad-request-every", "4"]) as server:
        config = regen_helpers.config(tmp_path, regen_model_dir, [server.url])
        summary = run_stage(RegenStage(), config, prompts_dir=prompts).summary
    out = Path(summary["regen_dir"])
    failed = pq.read_table(out / "failed-00000.parquet").to_pylist()
    assert len(failed) == 3 and summary["failed"] == 3 and summary["done"]
    assert all(
        r["status"] == "failed" and "injected fault" in r["error"] and "HTTP 400" in r["error"]
        for r in failed
    )
    assert sorted(_ids(out) + _ids(out, "failed")) == sorted(r["sample_id"] for r in rows)
    assert all(r["attempts"] == 1 for r in failed)  # a 400 is not retried


def test_server_gone_fails_its_shard_alone_and_retry_completes_it(
    tmp_path, regen_model_dir, regen_helpers
):
    shards = [[regen_helpers.chat(f"a{i}", f"first {i}") for i in range(4)]]
    shards.append([regen_helpers.chat(f"b{i}", f"second {i}") for i in range(10)])
    prompts = regen_helpers.write_prompts(tmp_path, shards)
    # shard 0 ends before the crash
    regen = {"max_retries": 2, "concurrency_per_server": 2, "shards_in_flight": 1}
    with reference_server(None, extra_args=[*SYNTH, "--fault-crash-after", "6"]) as doomed:
        config = regen_helpers.config(tmp_path, regen_model_dir, [doomed.url], **regen)
        with pytest.raises(UnitsFailed, match=r"regen failed for units \[1\]") as failure:
            run_stage(RegenStage(), config, prompts_dir=prompts)
    out = failure.value.out_dir
    assert json.loads((out / "failed_shards.json").read_text()) == [1]
    assert Manifest.read(out) is None
    assert sorted(_ids(out)) == [f"a{i}" for i in range(4)]
    journaled = len(read_journal(out / "shard-00001.journal.jsonl"))
    assert journaled >= 1  # what succeeded before the crash is kept
    with reference_server(None, extra_args=SYNTH) as healthy:
        config = regen_helpers.config(tmp_path, regen_model_dir, [healthy.url], **regen)
        summary = run_stage(RegenStage(), config, prompts_dir=prompts, shard_ids=[1]).summary
    assert summary["done"] and summary["failed_shards"] == []
    assert Path(summary["regen_dir"]) == out  # servers are not part of the stage fingerprint
    assert sorted(_ids(out)) == sorted([f"a{i}" for i in range(4)] + [f"b{i}" for i in range(10)])


def _watch_waiting(regen_dir: Path, seen: list[str], stop: threading.Event) -> None:
    """Collect the ``waiting_for_servers`` lines ``regen status`` shows while the stage runs."""
    while not stop.wait(0.2):
        try:
            waiting = regen_status(regen_dir).waiting_for_servers
        except StageInputError:  # not planned yet
            continue
        if waiting:
            seen.append(waiting)


def test_dead_server_fails_its_shard_after_no_server_timeout_without_spending_retries(
    tmp_path, regen_model_dir, regen_helpers, caplog
):
    """50 retries a sample: spending one per readmission probe during an outage would take minutes
    and end with "failed 51 times"; waiting in the pool spends none, so only ``no_server_timeout_s``
    ends the shard."""
    prompts = regen_helpers.write_prompts(
        tmp_path, [[regen_helpers.chat(f"q{i}", f"question {i}") for i in range(6)]]
    )
    dead = f"http://127.0.0.1:{free_port()}"
    config = regen_helpers.config(
        tmp_path,
        regen_model_dir,
        [dead],
        max_retries=50,
        eject_after_failures=2,
        no_server_timeout_s=3,
    )
    out, seen, stop = regen_dir_for(config, prompts), [], threading.Event()
    watcher = threading.Thread(target=_watch_waiting, args=(out, seen, stop))
    watcher.start()
    try:
        with pytest.raises(UnitsFailed, match=r"regen failed for units \[0\]"):
            run_stage(RegenStage(), config, prompts_dir=prompts)
    finally:
        stop.set()
        watcher.join()
    assert json.loads((out / "failed_shards.json").read_text()) == [0]
    lines = [
        line
        for line in caplog.text.splitlines()
        if "regen shard 0 failed: no server healthy for 3s" in line
    ]
    # one line
    assert (
        lines and dead in lines[0] and "last error: health probe: ClientConnectorError" in lines[0]
    )
    assert seen and seen[0].startswith("waiting for servers for") and dead in seen[0]
    assert not (out / waiting_name(0)).exists()


def test_a_server_back_within_no_server_timeout_resumes_the_shard_without_spending_retries(
    tmp_path, regen_model_dir, regen_helpers
):
    """One retry a sample: the request cut by the crash spends it, every other waits the outage out
    in the pool."""
    rows = [regen_helpers.chat(f"q{i}", f"question {i}") for i in range(8)]
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    argv = [sys.executable, "-m", "eagle3.serve.reference", *SYNTH]
    port = free_port()
    regen = {
        "concurrency_per_server": 2,
        "max_retries": 1,
        "eject_after_failures": 1,
        "no_server_timeout_s": 300,
    }
    config = regen_helpers.config(tmp_path, regen_model_dir, [f"http://127.0.0.1:{port}"], **regen)
    marker, finished = regen_dir_for(config, prompts) / waiting_name(0), threading.Event()

    # the server lives as long as the thread that starts it (die_with_parent)
    def restart_when_waiting() -> None:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        with ServerProcess(argv, port=port, name="restarted server"):
            finished.wait()

    restarter = threading.Thread(target=restart_when_waiting)
    try:
        with ServerProcess([*argv, "--fault-crash-after", "3"], port=port, name="doomed server"):
            restarter.start()
            summary = run_stage(RegenStage(), config, prompts_dir=prompts).summary
    finally:
        finished.set()
        restarter.join()
    assert summary["done"] and summary["failed"] == 0
    assert sorted(_ids(Path(summary["regen_dir"]))) == sorted(r["sample_id"] for r in rows)


def test_sigterm_stops_a_shard_waiting_for_servers_with_its_journal_flushed(
    tmp_path, regen_model_dir, regen_helpers
):
    rows = [regen_helpers.chat(f"q{i}", f"question {i}") for i in range(8)]
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    with reference_server(None, extra_args=[*SYNTH, "--fault-crash-after", "3"]) as doomed:
        config = regen_helpers.config(
            tmp_path,
            regen_model_dir,
            [doomed.url],
            concurrency_per_server=1,
            eject_after_failures=1,
            no_server_timeout_s=600,
        )
        marker = regen_dir_for(config, prompts) / waiting_name(0)

        def terminate_when_waiting() -> None:
            deadline = time.monotonic() + 300
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=terminate_when_waiting, daemon=True).start()
        with pytest.raises(SystemExit) as stopped:  # long before the 600 s timeout
            run_stage(RegenStage(), config, prompts_dir=prompts)
    assert stopped.value.code == 128 + signal.SIGTERM
    # the stage's handler is gone with the stage
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert 3 <= len(read_journal(marker.parent / "shard-00000.journal.jsonl")) < len(rows)
    assert not marker.exists()


def test_timed_out_request_still_running_is_retried_under_a_new_rid_and_written_once(
    tmp_path, regen_model_dir, regen_helpers
):
    """The first request stalls past the client's timeout while the server keeps it in flight.
    Resending its rid would meet SGLang's duplicate-rid 400; the retry carries ``-a2`` instead,
    succeeds, and the sample is written once."""
    rows = [regen_helpers.chat(f"q{i}", f"question {i}") for i in range(3)]
    prompts = regen_helpers.write_prompts(tmp_path, [rows])
    log = tmp_path / "requests.log"
    extra = [*SYNTH, "--fault-stall-first-s", "4", "--request-log", str(log)]
    with reference_server(None, extra_args=extra) as server:
        config = regen_helpers.config(
            tmp_path, regen_model_dir, [server.url], request_timeout_s=1.0, concurrency_per_server=1
        )
        summary = run_stage(RegenStage(), config, prompts_dir=prompts).summary
    assert summary["done"] and summary["failed"] == 0
    out = Path(summary["regen_dir"])
    written = [r for p in out.glob("shard-*.parquet") for r in pq.read_table(p).to_pylist()]
    assert sorted(r["sample_id"] for r in written) == ["q0", "q1", "q2"]  # each once, none lost
    [stalled] = [r for r in written if r["attempts"] == 2]
    # the retry's own rid was served
    assert f"{stalled['sample_id']}:0-a2" in log.read_text().split()


def test_retry_policy_separates_sglang_transients_from_input_errors():
    assert attempt_rid("s1:0", 3) == "s1:0-a3"
    assert classify(400, "HTTP 400: Duplicate request ID detected: s1:0-a1") == "transient"
    assert (
        classify(429, "HTTP 429: too many requests")
        == classify(503, "HTTP 503: queue full")
        == "transient"
    )
    assert classify(500, "HTTP 500: boom") == classify(408, "HTTP 408: timeout") == "failure"
    assert classify(400, "HTTP 400: input_ids must be a non-empty list") == "permanent"
    assert classify(422, "HTTP 422: bad field") == "permanent"
