"""What the online run's status says, from the broker's real bookkeeping and the supervisor's
records: each producer's state, batches, rate, restarts and last error (naming the batch it held),
the trainer, the store."""

from __future__ import annotations

from eagle3.train.online.broker import Broker
from eagle3.train.online.status import (
    ProducerRecord,
    online_status,
    producer_table,
    status_line,
    status_note,
)


def _key(step: int) -> tuple:
    return (0, step, 0, (f"s{2 * step}", f"s{2 * step + 1}"))


def test_a_restarted_producer_shows_which_batch_it_lost_and_why_beside_the_trainer_and_the_store():
    broker = Broker(total=4, world_size=1, max_inflight=2, claim_timeout_s=60.0)
    assert broker.claim("p0", 0) == 0
    broker.deliver("p0", 0, _key(0), "m0")
    held = broker.claim("p0", 0)
    p0 = ProducerRecord(state="running")
    p0.failed_on(
        held, ConnectionResetError("the actor's process died\nlong traceback"), state="restarting"
    )
    p0.restarts += 1
    assert broker.register("p0") == 1  # the restarted loop releases the batch it held
    assert broker.take(0, 0, 0) == (_key(0), ["m0"])
    status = online_status(broker.status(), {"p0": p0, "p1": ProducerRecord(state="running")})

    table = producer_table(status)
    rows = {row["worker"]: row for row in table.rows}
    assert rows["p0"] == {
        "worker": "p0",
        "state": "restarting",
        "batches": "1",
        "rate": rows["p0"]["rate"],
        "restarts": 1,
        "last_error": "batch 1: ConnectionResetError: the actor's process died",
    }
    assert status["producers"][0]["released"] == [1]
    assert rows["p1"]["state"].startswith("waiting") and rows["p1"]["restarts"] == 0
    assert rows["trainer"]["batches"] == "1/4" and "samples/s" in rows["trainer"]["rate"]
    assert status["consumed_samples"] == 2 and status["trainer"]["samples_per_s"] > 0
    assert rows["store"]["state"].startswith("0/2 batches held")
    assert table.description.startswith("ETA ") and "restarted: p0 x1" in table.description
    assert "store 0/2 batches held" in status_note(status)
    assert "p0 restarting 1 batches" in status_line(
        status
    ) and "batch 1: ConnectionResetError" in status_line(status)


def test_a_producer_holding_a_claim_is_shown_capturing_that_batch_and_a_finished_run_has_no_eta_left():
    broker = Broker(total=1, world_size=1, max_inflight=2, claim_timeout_s=60.0)
    broker.claim("p0", 0)
    status = online_status(broker.status(), {"p0": ProducerRecord(state="running")})
    assert status["producers"][0]["state"] == "capturing batch 0" and status["eta_s"] is None
    broker.deliver("p0", 0, _key(0), "m0")
    broker.take(0, 0, 0)
    done = online_status(broker.status(), {"p0": ProducerRecord(state="done")})
    assert done["eta_s"] == 0.0 and producer_table(done).rows[-2]["state"] == "done"
