"""The one progress model: percent of this run's plan, a rate over a window of this run's work, a
human ETA."""

from __future__ import annotations

import json

import pytest

from eagle3.stage import Progress, RateWindow, human_duration


def test_eta_reads_in_hours_and_minutes_and_a_finished_stage_is_at_100_percent():
    assert human_duration(31 * 3600 + 12 * 60 + 5) == "31 h 12 min"
    assert human_duration(250) == "4 min 10 s" and human_duration(12.4) == "12 s"
    running = Progress(done=50, total=200, per_s=1 / 600)  # 150 left at one every 10 min: 25 h
    assert (
        running.percent == 25.0
        and running.eta == "25 h 0 min"
        and "ETA 25 h 0 min" in running.describe()
    )
    assert Progress(done=50, total=200).eta == "unknown"
    assert Progress(done=199, total=200).complete().percent == 100.0
    assert Progress(done=0, total=0).percent == 100.0 and Progress(done=3, total=3).eta == "done"


def test_rate_counts_only_this_runs_work_over_the_window():
    now = [0.0]
    rates = RateWindow(window_s=100, clock=lambda: now[0])
    # done before this run: no rate from it
    resumed = rates.observe(Progress(done=500, total=1000, tokens=9000))
    assert resumed.per_s is None and resumed.eta == "unknown"
    now[0] = 50.0
    assert rates.observe(Progress(done=600, total=1000, tokens=9500)).per_s == 2.0
    now[0] = 100.0
    half = rates.observe(Progress(done=700, total=1000, tokens=10000))
    assert half.per_s == 2.0 and half.tokens_per_s == 10.0 and half.eta_s == 150.0
    # stalled for 200 s, longer than the window: the rate decays to 0 instead of staying at 2/s
    now[0] = 300.0
    stalled = rates.observe(Progress(done=700, total=1000, tokens=10000))
    assert stalled.per_s == 0.0 and stalled.eta == "unknown"


def test_regen_status_counts_the_shards_the_run_planned_not_the_whole_pool(
    tmp_path, write_regen_stage
):
    from eagle3.regen.status import regen_status
    from eagle3.rundir.layout import PLAN_FILE

    regen = write_regen_stage(tmp_path / "root" / "regen" / "fp", shards=3, rows=4)
    plan = json.loads((regen / PLAN_FILE).read_text())
    # tonight: 2 of the 3 shards (--scale)
    (regen / PLAN_FILE).write_text(json.dumps(plan | {"units": [0, 2]}))
    status = regen_status(regen)
    assert (status.done, status.total, status.shards_total) == (8, 8, 2)
    assert status.progress.percent == 100.0 and status.to_dict()["eta"] == "done"
    assert regen_status(regen, shard_ids=[1]).total == 4


def test_while_no_server_is_healthy_the_progress_says_waiting_for_servers_and_shows_no_eta(
    tmp_path, write_regen_stage
):
    """A regen shard waiting for servers still journals its pre-tokenized samples (they need no
    request): they must not make up a rate and an ETA (~24 h was shown), in ``regen status``, the
    CLI bar or the UI (a rate window)."""
    import time

    import pyarrow.parquet as pq

    from eagle3.regen.conversation import pretokenized_row
    from eagle3.regen.journal import Journal, journal_name
    from eagle3.regen.shard import waiting_name
    from eagle3.regen.status import regen_status
    from eagle3.rundir.layout import shard_name
    from eagle3.rundir.runroot import atomic_write_text

    regen = write_regen_stage(tmp_path / "root" / "regen" / "fp", shards=1, rows=40)
    rows = pq.read_table(regen / shard_name(0)).to_pylist()
    (regen / shard_name(0)).unlink()  # shard 0 is running
    outage = {
        "since": time.time() - 9,
        "timeout_s": 300,
        "servers": "http://127.0.0.1:9 (5 consecutive failures, "
        "last error: ClientConnectorError: Cannot connect to host 127.0.0.1:9)",
    }
    # as the shard keeps it while no server is up
    atomic_write_text(regen / waiting_name(0), json.dumps(outage))
    now = [0.0]
    bar = RateWindow(window_s=300, clock=lambda: now[0])
    with Journal(regen / journal_name(0), fsync_every=1) as journal:
        for step, row in enumerate(rows[:6]):
            journal.append(pretokenized_row(row))
            now[0] = 10.0 * step
            for progress in (
                regen_status(regen).progress,
                bar.observe(regen_status(regen).progress),
            ):
                line = progress.describe()
                assert (
                    "ETA" not in line and "/s" not in line and " - waiting for servers for " in line
                ), line
                # the servers: regen status
                assert line.endswith("(fails at 300s)") and "127.0.0.1:9" not in line
                assert progress.eta_s is None and progress.eta == "unknown"
    assert regen_status(regen).done == 6
    # a server is back: the rate is this run's served work from here
    (regen / waiting_name(0)).unlink()
    now[0] += 10.0
    assert "ETA" in bar.observe(regen_status(regen).progress).describe()


def test_regen_progress_counts_the_tokens_of_samples_in_flight_and_the_eta_follows_tokens(
    tmp_path, write_regen_stage
):
    """Sixteen long answers in flight and two finished: the finished-only count said 1 tok/s and an
    ETA of hours while the server made 9-10 tok/s. In-flight samples are credited their elapsed time
    at the finished samples' rate, so the tokens (and a rate window over them) are the work under
    way, and the ETA is tokens left / rate."""
    import time

    import pyarrow.parquet as pq

    from eagle3.regen.journal import Journal, journal_name
    from eagle3.regen.shard import in_flight_name
    from eagle3.regen.status import regen_status
    from eagle3.rundir.layout import shard_name
    from eagle3.rundir.runroot import atomic_write_text

    regen = write_regen_stage(tmp_path / "root" / "regen" / "fp", shards=1, rows=40)
    rows = pq.read_table(regen / shard_name(0)).to_pylist()
    (regen / shard_name(0)).unlink()  # shard 0 is running
    now = time.time()
    with Journal(regen / journal_name(0), fsync_every=1) as journal:
        for row in rows[:2]:  # 100 tokens each in 10 s: 10 tokens per second per sample
            meta = json.dumps({"total_completion_tokens": 100})
            journal.append(row | {"meta": meta, "latency_s": 10.0, "status": "ok"})
    started = [now - 5.0] * 16  # sixteen samples in flight for 5 s: about 50 tokens each so far
    atomic_write_text(regen / in_flight_name(0), json.dumps({"at": now, "started": started}))
    status = regen_status(regen)
    assert status.done == 2 and status.tokens_per_sample == 100
    assert 780 <= status.tokens_in_flight <= 840 and status.tokens == 200 + status.tokens_in_flight
    progress = status.progress.model_copy(update={"tokens_per_s": 160.0})  # a rate window's
    left = 38 * 100 - status.tokens_in_flight  # the samples left at the mean, less those running
    assert progress.eta_s == pytest.approx(left / 160.0)
    long = status.progress.model_copy(update={"tokens_per_s": 160.0, "tokens_in_flight": 16 * 300})
    assert long.eta_s == pytest.approx(22 * 100 / 160.0)  # past the mean: 22 not started remain
    atomic_write_text(regen / in_flight_name(0), json.dumps({"at": now - 600, "started": started}))
    assert regen_status(regen).tokens_in_flight == 0  # a stale marker (a dead shard): no credit
