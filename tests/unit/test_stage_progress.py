"""The one progress model: percent of this run's plan, a rate over a window of this run's work, a human ETA."""

from __future__ import annotations

import json

from eagle3.stage import Progress, RateWindow, human_duration


def test_eta_reads_in_hours_and_minutes_and_a_finished_stage_is_at_100_percent():
    assert human_duration(31 * 3600 + 12 * 60 + 5) == "31 h 12 min"
    assert human_duration(250) == "4 min 10 s" and human_duration(12.4) == "12 s"
    running = Progress(done=50, total=200, per_s=1 / 600)  # 150 left at one every 10 min: 25 h
    assert running.percent == 25.0 and running.eta == "25 h 0 min" and "ETA 25 h 0 min" in running.describe()
    assert Progress(done=50, total=200).eta == "unknown"
    assert Progress(done=199, total=200).complete().percent == 100.0
    assert Progress(done=0, total=0).percent == 100.0 and Progress(done=3, total=3).eta == "done"


def test_rate_counts_only_this_runs_work_over_the_window():
    now = [0.0]
    rates = RateWindow(window_s=100, clock=lambda: now[0])
    resumed = rates.observe(Progress(done=500, total=1000, tokens=9000))  # done before this run: no rate from it
    assert resumed.per_s is None and resumed.eta == "unknown"
    now[0] = 50.0
    assert rates.observe(Progress(done=600, total=1000, tokens=9500)).per_s == 2.0
    now[0] = 100.0
    half = rates.observe(Progress(done=700, total=1000, tokens=10000))
    assert half.per_s == 2.0 and half.tokens_per_s == 10.0 and half.eta_s == 150.0
    now[0] = 300.0  # stalled for 200 s, longer than the window: the rate decays to 0 instead of staying at 2/s
    stalled = rates.observe(Progress(done=700, total=1000, tokens=10000))
    assert stalled.per_s == 0.0 and stalled.eta == "unknown"


def test_regen_status_counts_the_shards_the_run_planned_not_the_whole_pool(tmp_path, write_regen_stage):
    from eagle3.layout import PLAN_FILE
    from eagle3.regen.status import regen_status

    regen = write_regen_stage(tmp_path / "root" / "regen" / "fp", shards=3, rows=4)
    plan = json.loads((regen / PLAN_FILE).read_text())
    (regen / PLAN_FILE).write_text(json.dumps(plan | {"units": [0, 2]}))  # tonight: 2 of the 3 shards (--scale)
    status = regen_status(regen)
    assert (status.done, status.total, status.shards_total) == (8, 8, 2)
    assert status.progress.percent == 100.0 and status.to_dict()["eta"] == "done"
    assert regen_status(regen, shard_ids=[1]).total == 4
