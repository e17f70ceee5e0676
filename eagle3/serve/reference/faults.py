"""Fault injection for tests, driven by the ``--fault-*`` flags (all off by default).

Faults live in the real server, not in mocks, so the client's retry, ejection and failure paths are
exercised over real HTTP. Random faults draw from a seeded generator: a test run is reproducible for
a given request order.

The slowdown (``--fault-slow-*``) is the gate's noise injector: a neighbour job that slows this
server for a while. Generation requests are cut into blocks of ``--fault-slow-block`` consecutive
requests; each block is slow with probability ``--fault-slow-fraction`` (``slow_schedule``, its own
generator seeded by ``--fault-seed``, so the other faults' draws do not move it), and every request
of a slow block waits ``--fault-slow-s`` first. Counting requests, not seconds, keeps a schedule the
same on a fast and on a loaded machine.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
from dataclasses import dataclass

logger = logging.getLogger(__name__)

CRASH_EXIT_CODE = 70


def slow_schedule(seed: int, fraction: float, blocks: int) -> list[bool]:
    """Which of the first ``blocks`` request blocks are slow: the slowdown's whole noise schedule
    for one seed."""
    rng = random.Random(f"slow-{seed}")
    return [rng.random() < fraction for _ in range(blocks)]


@dataclass
class Fault:
    """What to answer instead of generating: an HTTP status and a message."""

    status: int
    message: str


class FaultInjector:
    def __init__(self, args: argparse.Namespace) -> None:
        self.fail_rate = args.fault_fail_rate
        self.extra_latency = args.fault_extra_latency
        self.crash_after = args.fault_crash_after
        self.bad_every = args.fault_bad_request_every
        self.stall_first_s = args.fault_stall_first_s
        self.slow_s = args.fault_slow_s
        self.slow_fraction = args.fault_slow_fraction
        self.slow_block = args.fault_slow_block
        self._rng = random.Random(args.fault_seed)
        # the generator slow_schedule replays
        self._slow_rng = random.Random(f"slow-{args.fault_seed}")
        self._slow_blocks: list[bool] = []
        self._requests = 0
        self._completed = 0
        self._crashing = False
        if self.enabled:
            logger.warning(
                "FAULT INJECTION: fail_rate=%s extra_latency=%ss crash_after=%s bad_request_every=%s stall_first=%ss "
                "slow=%ss for a %s fraction of %s-request blocks",
                self.fail_rate,
                self.extra_latency,
                self.crash_after,
                self.bad_every,
                self.stall_first_s,
                self.slow_s,
                self.slow_fraction,
                self.slow_block,
            )

    @property
    def enabled(self) -> bool:
        slow = self.slow_s and self.slow_fraction
        return any(
            (
                self.fail_rate,
                self.extra_latency,
                self.crash_after,
                self.bad_every,
                self.stall_first_s,
                slow,
            )
        )

    def _slow(self) -> bool:
        """Whether the current request (``self._requests``, 1-based) falls in a slow block of
        ``slow_schedule``."""
        block = (self._requests - 1) // self.slow_block
        while len(self._slow_blocks) <= block:
            self._slow_blocks.append(self._slow_rng.random() < self.slow_fraction)
        return self._slow_blocks[block]

    async def before(self) -> Fault | None:
        """Called on every generation request before it is queued; may delay it or answer a fault.

        The request's rid is already registered as in flight (``app._registered``), so a stalled
        request holds its rid the way a long generation does on SGLang: a client that times out and
        resends the same rid meets the duplicate-rid 400.
        """
        if self._crashing:  # a dying server answers nothing more: the exit drops this connection
            await asyncio.get_running_loop().create_future()
        self._requests += 1
        if self.stall_first_s and self._requests == 1:
            await asyncio.sleep(self.stall_first_s)
        if self.extra_latency:
            await asyncio.sleep(self.extra_latency)
        if self.slow_s and self.slow_fraction and self._slow():
            await asyncio.sleep(self.slow_s)
        fault = None
        if self.bad_every and self._requests % self.bad_every == 0:
            fault = Fault(
                400, f"injected fault: request #{self._requests} rejected as a bad request"
            )
        elif self.fail_rate and self._rng.random() < self.fail_rate:
            fault = Fault(500, f"injected fault: internal error on request #{self._requests}")
        # in the server log too, so a client's retries can be matched to what was injected
        if fault is not None:
            logger.warning("answering %d: %s", fault.status, fault.message)
        return fault

    def after_completion(self) -> None:
        """Called when a request's reply has been sent; after ``crash_after`` of them the process
        exits, 50 ms later (so that reply reaches its client), and admits no request meanwhile.
        Requests already generating may still finish in those 50 ms, as on a crashing server; new
        ones would have finished too on a fast machine (~10 ms each), which made "N requests, then
        the server is gone" depend on the machine's speed."""
        self._completed += 1
        if (
            self.crash_after is not None
            and self._completed >= self.crash_after
            and not self._crashing
        ):
            self._crashing = True
            logger.error("injected fault: exiting after %d completed requests", self._completed)
            asyncio.get_running_loop().call_later(0.05, os._exit, CRASH_EXIT_CODE)
