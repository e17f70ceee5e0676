"""The night's flows on online features (``train.features=online``): capture decides online and
writes nothing, then vocab -> online training -> export: a valid draft, its summary says online and
why, and no features directory is written; the train flow's artifacts show each producer (state,
batches, rate, restarts, the last error), the trainer's rate, the store's backlog and the ETA, a
producer killed mid-run included."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from eagle3.config.pipeline import with_overrides
from eagle3.model.export_format import validate_export
from tests.unit.train.online.conftest import online_world  # noqa: F401  (the session fixture)


def _online_night(config, regen: Path):
    """What the nightly flow runs after regen: capture (which decides online, capturing nothing),
    vocab, train."""
    from flows.capture import capture_flow
    from flows.train import train_flow
    from flows.vocab import vocab_flow

    features = capture_flow(config, regen_dir=str(regen))
    assert features.online and features.regen_dir == regen
    return train_flow(config, features, vocab_flow(config, features))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_online_train_flow_trains_and_exports_a_valid_draft_without_features(
    online_world,  # noqa: F811
    tmp_path,
    prefect_harness,
):
    import ray

    root = tmp_path / "root"
    config = with_overrides(
        online_world.config, [f"root={root}", "train.features=online", "train.epochs=1"]
    )
    try:
        result = _online_night(config, online_world.regen)
    finally:
        ray.shutdown()
    assert validate_export(Path(result.export)) == []
    summary = result.summary
    assert (
        summary["features"] == "online" and summary["features_decision"] == "train.features=online"
    )
    assert summary["store"]["ready"] == 0 and summary["steps"] == summary["store"]["consumed"]
    assert not (root / "features").exists()


def _latest(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_latest_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    return found[0] if found else None


def _wait_for(predicate, what, timeout=600, poll_s=0.05):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def _this_runs_producers() -> list[psutil.Process]:
    """The producer actors' processes of this test's own Ray (workers under the raylet this process
    started)."""
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if any("ProducerActor" in part for part in p.cmdline())
    ]


def _kill_producer_once_it_holds_a_batch(killed: dict) -> None:
    import ray

    from eagle3.train.online.transport import NAMESPACE, get_broker

    _wait_for(ray.is_initialized, "the run to start Ray")
    brokers = lambda: [  # noqa: E731
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == NAMESPACE and a["name"].startswith("broker-")
    ]
    _wait_for(brokers, "the run's broker")
    broker = get_broker(brokers()[0])
    status = lambda: ray.get(broker.status.remote())  # noqa: E731
    _wait_for(
        lambda: status()["delivered"] >= 1 and "p0" in status()["claims"].values(),
        "p0 holding a batch",
    )
    (producer,) = _this_runs_producers()
    killed["pid"] = producer.pid
    producer.send_signal(signal.SIGKILL)
    # the broker is named for the draft
    key = f"train-producers-live-{brokers()[0].removeprefix('broker-')}"

    def restart_shown_mid_run() -> bool:
        table = _latest(key)
        rows = {row["worker"]: row for row in json.loads(table.data)} if table is not None else {}
        if rows.get("p0", {}).get("restarts") == 1 and rows["trainer"]["state"] == "training":
            killed["mid_run"] = (rows, table.description)
        return "mid_run" in killed or status()["consumed"] >= status()["total"]

    _wait_for(
        restart_shown_mid_run, "the live table to show the restart, or the run's end", poll_s=0.5
    )


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_online_train_flow_shows_producers_trainer_backlog_eta_and_a_killed_producers_restart(
    online_world,  # noqa: F811
    tmp_path,
    prefect_harness,
):
    import ray

    root = tmp_path / "root"
    config = with_overrides(
        online_world.config,
        [f"root={root}", "train.features=online", "orchestration.progress_every_s=0.5"],
    )
    killed: dict = {}
    killer = threading.Thread(
        target=_kill_producer_once_it_holds_a_batch, args=(killed,), daemon=True
    )
    killer.start()
    try:
        result = _online_night(config, online_world.regen)
    finally:
        ray.shutdown()
    killer.join(1)
    assert killed, "the producer was not killed mid-run"
    assert "mid_run" in killed, (
        "the live table never showed the restart while the trainer was still training"
    )
    rows, description = killed["mid_run"]
    assert (
        rows["p0"]["last_error"].startswith(("batch ", "between batches"))
        and "restarted: p0 x1" in description
    )
    # killed holding a batch: that batch is re-captured
    held = rows["p0"]["last_error"].startswith("batch ")
    fp, store = result.fingerprint, result.summary["store"]
    assert (
        store["ready"] == 0
        and store["consumed"] == store["total"]
        and store["reclaimed"] >= int(held)
    )

    table = _latest(f"train-producers-live-{fp}")
    rows = {row["worker"]: row for row in json.loads(table.data)}
    assert set(rows) == {"p0", "trainer", "store"}
    p0 = rows["p0"]
    assert (
        p0["state"] == "done" and p0["restarts"] == 1 and int(p0["batches"]) == store["delivered"]
    )
    assert re.match(r"(batch \d+|between batches): ActorUnavailableError: ", p0["last_error"]), p0[
        "last_error"
    ]
    assert "batches/s" in p0["rate"]
    assert rows["trainer"] == {
        **rows["trainer"],
        "state": "done",
        "batches": f"{store['total']}/{store['total']}",
    }
    assert "samples/s" in rows["trainer"]["rate"]
    assert rows["store"]["state"].startswith(f"0/{config.train.online.max_inflight} batches held")
    assert table.description.startswith("ETA ") and "restarted: p0 x1" in table.description

    card = _latest(f"train-progress-{fp}")
    assert card.data == 100.0
    assert card.description.startswith("ETA done") and "tok/s" in card.description
    assert f"store 0/{config.train.online.max_inflight} batches held" in card.description
    assert "samples/s" in card.description and "restarted: p0 x1" in card.description
