"""The broker's bookkeeping: bounded store, in-order claims, duplicates dropped, dead producers'
claims reopened."""

from __future__ import annotations

from eagle3.train.online.broker import DONE, WAIT, Broker


def _broker(total=6, world_size=1, max_inflight=2, claim_timeout_s=60.0):
    return Broker(
        total=total,
        world_size=world_size,
        max_inflight=max_inflight,
        claim_timeout_s=claim_timeout_s,
    )


def test_a_producer_waits_while_the_store_holds_max_inflight_batches():
    b = _broker()
    assert [b.claim("p0", 0), b.claim("p0", 0)] == [0, 1]
    assert b.claim("p0", 0) == WAIT
    b.deliver("p0", 0, "k0", "m0")
    b.deliver("p0", 1, "k1", "m1")
    assert b.claim("p0", 0) == WAIT and b.status()["ready"] == 2
    assert b.take(0, 0, 0) == ("k0", ["m0"])
    assert b.claim("p0", 0) == 2  # the trainer took one: room for one more


def test_a_batch_delivered_twice_is_stored_once():
    b = _broker()
    i = b.claim("p0", 0)
    assert b.deliver("p0", i, "k", "m") is True
    assert b.deliver("p1", i, "k", "m") is False
    b.take(0, i, 0)
    assert b.deliver("p1", i, "k", "m") is False  # consumed: still a duplicate
    assert b.status()["duplicates"] == 2 and b.status()["ready"] == 0


def test_a_restarted_producer_recaptures_only_what_it_had_not_delivered():
    b = _broker(max_inflight=3)
    claimed = [b.claim("p0", 0) for _ in range(3)]
    b.deliver("p0", claimed[0], "k0", "m0")
    assert b.claim("p1", 0) == WAIT  # 1 and 2 are p0's
    assert b.register("p0") == 2  # p0 died with 1 and 2 in hand
    assert [b.claim("p1", 0), b.claim("p1", 0)] == [1, 2]
    assert b.status()["ready"] == 1  # batch 0 stays delivered


def test_a_claim_older_than_the_timeout_goes_to_another_producer():
    b = _broker(claim_timeout_s=0.0)
    assert b.claim("p0", 0) == 0
    assert b.claim("p1", 0) == 0
    assert b.status()["reclaimed"] == 1


def test_a_resumed_trainer_gets_again_what_it_took_after_its_checkpoint():
    b = _broker(total=4, max_inflight=4)
    for _ in range(4):
        i = b.claim("p0", 0)
        b.deliver("p0", i, f"k{i}", f"m{i}")
    for i in range(3):
        b.take(0, i, 0)
    b.seek(0, 1)  # checkpoint after batch 0: batches 1 and 2 trained into lost weights
    # 3 is still in the store
    assert [b.claim("p0", 0), b.claim("p0", 0), b.claim("p0", 0)] == [1, 2, WAIT]
    for i in (1, 2):
        b.deliver("p0", i, f"k{i}", f"m{i}")
    assert [b.take(0, i, 0)[0] for i in (1, 2, 3)] == ["k1", "k2", "k3"]
    assert b.claim("p0", 0) == DONE and b.status()["ready"] == 0


def test_ranks_take_their_own_batches_and_the_window_follows_the_slowest():
    b = _broker(total=6, world_size=2, max_inflight=2)
    for _ in range(2):
        i = b.claim("p0", 0)
        b.deliver("p0", i, i, i)
    b.take(1, 1, 0)
    assert b.claim("p0", 0) == WAIT  # rank 0 has not taken batch 0: the window starts there
    b.take(0, 0, 0)
    assert b.claim("p0", 0) == 2
