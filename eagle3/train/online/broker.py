"""The broker between capture producers and trainer ranks: who captures which batch, what the store
holds, exactly once.

One ``Broker`` per training run (a named, detached Ray actor: ``open_broker``) keeps the bookkeeping
and owns the batches: a producer hands its batch to ``deliver``, which puts it in Ray's object store
from the broker's process, so a batch a producer delivered outlives that producer (Ray frees an
object when its owner dies; ``ray.put``'s ``_owner`` argument, which would have saved that copy, is
gone from Ray 2.56).

* **Order and memory bound.** Batches have global indices (``eagle3.train.online.plan``). A producer
  claims the lowest index that is neither delivered, consumed nor claimed, and only inside the
  window ``[low, low + max_inflight)``, ``low`` being the lowest index a trainer rank has yet to
  take: the store never holds more than ``max_inflight`` batches, and the batch the trainer needs
  next is always claimable first (no deadlock on a full store).
* **Exactly once.** A delivery whose index is already delivered, consumed, or before the window is
  dropped (its object is freed); the trainer checks each batch's key ``(epoch, step, rank, sample
  ids)`` against its own plan.
* **Producer death.** A producer (re)starting under its name first releases what it had claimed
  (``register``); a claim older than ``claim_timeout_s`` is given to the next producer that asks.
  Only undelivered batches are captured again.
* **Trainer death.** A trainer rank resuming from its checkpoint ``seek``s to its position: the
  batches it had taken since are claimable again (they trained into weights the checkpoint does not
  hold), nothing before it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

DONE = -1  # claim(): every batch is delivered or consumed
WAIT = -2  # claim(): the window is full or every open batch is claimed; ask again


@dataclass
class _Claim:
    producer: str
    since: float


@dataclass
class BrokerStats:
    delivered: int = 0
    consumed: int = 0
    duplicates: int = 0
    reclaimed: int = 0
    consumed_samples: int = 0
    per_producer: dict[str, int] = field(default_factory=dict)
    # per producer: what its last restart released
    released: dict[str, list[int]] = field(default_factory=dict)
    # per producer: loops started (1 + restarts)
    registrations: dict[str, int] = field(default_factory=dict)


def _put(message: Any) -> Any:
    """``message`` in Ray's object store when this runs in a Ray worker (the broker actor), else as
    is (tests)."""
    import ray

    return ray.put(message) if ray.is_initialized() else message


class Broker:
    """The bookkeeping (module docstring); thread-safe, blocking calls time out so callers can
    notice a stop."""

    def __init__(
        self, *, total: int, world_size: int, max_inflight: int, claim_timeout_s: float
    ) -> None:
        self.total, self.world_size = total, world_size
        self.max_inflight, self.claim_timeout_s = max_inflight, claim_timeout_s
        self._next = list(range(world_size))  # per rank: the next global index it takes
        self._ready: dict[int, tuple[Any, list[Any]]] = {}  # index -> (key, [object ref])
        self._consumed: set[int] = set()  # taken indices at or above low
        self._claims: dict[int, _Claim] = {}
        self._cond = threading.Condition()
        self.stats = BrokerStats()
        self._started = time.monotonic()

    @property
    def low(self) -> int:
        return min(self._next)

    def _open(self, index: int) -> bool:
        return index not in self._ready and index not in self._consumed

    def register(self, producer: str) -> int:
        """A producer (re)starts: release its earlier claims (it died before delivering them);
        returns how many."""
        with self._cond:
            mine = [i for i, c in self._claims.items() if c.producer == producer]
            for i in mine:
                del self._claims[i]
            self.stats.reclaimed += len(mine)
            self.stats.registrations[producer] = self.stats.registrations.get(producer, 0) + 1
            if mine:
                self.stats.released[producer] = sorted(mine)
            self._cond.notify_all()
            return len(mine)

    def claim(self, producer: str, timeout: float = 1.0) -> int:
        """The next batch index for ``producer`` to capture, ``WAIT`` after ``timeout`` seconds, or
        ``DONE``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                index = self._claimable(producer)
                if index is not None:
                    return index
                if self.low >= self.total or all(
                    not self._open(i) for i in range(self.low, self.total)
                ):
                    return DONE
                left = deadline - time.monotonic()
                if left <= 0:
                    return WAIT
                self._cond.wait(left)

    def _claimable(self, producer: str) -> int | None:
        now = time.monotonic()
        for index in range(self.low, min(self.low + self.max_inflight, self.total)):
            if not self._open(index):
                continue
            claim = self._claims.get(index)
            if claim is not None and now - claim.since < self.claim_timeout_s:
                continue
            if claim is not None:
                self.stats.reclaimed += 1
            self._claims[index] = _Claim(producer, now)
            return index
        return None

    def deliver(self, producer: str, index: int, key: Any, message: Any) -> bool:
        """Hand over batch ``index``: the broker puts ``message`` in the object store itself, so the
        object is the broker's and outlives the producer (``eagle3.train.online.transport``). False
        when it is a duplicate (already delivered or consumed, or before the window): dropped, never
        stored."""
        with self._cond:
            self._claims.pop(index, None)
            if index < self.low or not self._open(index):
                self.stats.duplicates += 1
                return False
        ref = [_put(message)]  # outside the lock: a large put must not stall the other calls
        with self._cond:
            if index < self.low or not self._open(index):  # a second delivery raced this one
                self.stats.duplicates += 1
                return False
            self._ready[index] = (key, ref)
            self.stats.delivered += 1
            self.stats.per_producer[producer] = self.stats.per_producer.get(producer, 0) + 1
            self._cond.notify_all()
            return True

    def take(self, rank: int, index: int, timeout: float = 1.0) -> tuple[Any, list[Any]] | None:
        """Batch ``index`` for trainer ``rank`` (its next one), removed from the store's
        bookkeeping; None after ``timeout`` seconds without it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if index != self._next[rank]:
                raise ValueError(
                    f"rank {rank} asked for batch {index}, but its next batch is {self._next[rank]} "
                    "(a resumed rank seeks first)"
                )
            while index not in self._ready:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            entry = self._ready.pop(index)
            self._consumed.add(index)
            self._next[rank] = index + self.world_size
            self._consumed = {i for i in self._consumed if i >= self.low}
            self.stats.consumed += 1
            key = entry[0]
            if isinstance(key, (tuple, list)):  # (epoch, step, rank, sample ids)
                self.stats.consumed_samples += len(key[-1])
            self._cond.notify_all()
            return entry

    def seek(self, rank: int, index: int) -> None:
        """Trainer ``rank`` resumes at batch ``index``: what it took from there on is captured
        again."""
        with self._cond:
            if index % self.world_size != rank:
                raise ValueError(
                    f"batch {index} is not rank {rank}'s (world size {self.world_size})"
                )
            self._consumed = {
                i for i in self._consumed if not (i >= index and i % self.world_size == rank)
            }
            self._next[rank] = index
            self._cond.notify_all()

    def status(self) -> dict[str, Any]:
        """Backlog and counters for the monitor (and the tests' "nothing left in the store")."""
        with self._cond:
            elapsed = max(time.monotonic() - self._started, 1e-9)
            return {
                "total": self.total,
                "low": self.low,
                "ready": len(self._ready),
                "claimed": len(self._claims),
                "claims": {i: c.producer for i, c in self._claims.items()},
                "delivered": self.stats.delivered,
                "consumed": self.stats.consumed,
                "duplicates": self.stats.duplicates,
                "reclaimed": self.stats.reclaimed,
                "per_producer": dict(self.stats.per_producer),
                "released": dict(self.stats.released),
                "registrations": dict(self.stats.registrations),
                "consumed_samples": self.stats.consumed_samples,
                "max_inflight": self.max_inflight,
                "elapsed_s": elapsed,
                "delivered_per_s": self.stats.delivered / elapsed,
                "consumed_per_s": self.stats.consumed / elapsed,
                "samples_per_s": self.stats.consumed_samples / elapsed,
            }

    def clear(self) -> int:
        """Drop every batch still held (a run that ends early); returns how many."""
        with self._cond:
            n = len(self._ready)
            self._ready.clear()
            return n
