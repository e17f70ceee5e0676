"""The scheduler: one worker thread that admits waiting requests into the engine's batch and steps
it.

The HTTP handlers run on the asyncio loop; the model runs on this thread (torch releases the GIL in
its kernels, so the loop stays responsive). Handlers ``submit`` a request and await an
``asyncio.Future`` (or read an ``asyncio.Queue`` when streaming); the thread resolves them with
``loop.call_soon_threadsafe``. Every step admits as many waiting requests as the engine has room for
(continuous batching): a request that arrives while others decode joins at the next step instead of
waiting for the batch to drain.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from eagle3.serve.reference.protocol import Completion, Engine, SamplingParams, Sequence

logger = logging.getLogger(__name__)


@dataclass
class _Ticket:
    seq: Sequence
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Completion]
    on_tokens: Callable[[list[int]], None] | None


class Scheduler:
    """Owns the waiting queue and the worker thread; ``submit`` is called from the event loop."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._waiting: deque[_Ticket] = deque()
        self._tickets: dict[int, _Ticket] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="eagle3-scheduler", daemon=True)
        self.completed = 0
        self.completion_tokens = 0
        self.verify_ct = 0

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def submit(
        self,
        rid: str,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> asyncio.Future[Completion]:
        loop = asyncio.get_running_loop()
        ticket = _Ticket(
            Sequence(rid, list(prompt_ids), params), loop, loop.create_future(), on_tokens
        )
        with self._cond:
            self._waiting.append(ticket)
            self._cond.notify()
        return ticket.future

    def _admit(self) -> None:
        room = self.engine.max_running - self.engine.num_running()
        batch = []
        with self._cond:
            while room > 0 and self._waiting:
                ticket = self._waiting.popleft()
                if ticket.future.cancelled():  # client went away before it started
                    continue
                batch.append(ticket)
                room -= 1
        for ticket in batch:
            self._tickets[id(ticket.seq)] = ticket
        if batch:
            self.engine.admit([t.seq for t in batch])

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._waiting and self.engine.num_running() == 0:
                    self._cond.wait()
                if self._stop:
                    return
            self._admit()
            try:
                stepped, done = self.engine.step()
            # a model error fails the requests in the batch, never the server
            except Exception as exc:
                logger.exception("engine step failed; failing its requests")
                self._fail_all(exc)
                continue
            self._deliver(stepped, done)

    def _deliver(self, stepped: list[Sequence], done: list[Sequence]) -> None:
        for seq in stepped:
            ticket = self._tickets[id(seq)]
            if ticket.on_tokens is not None:
                ticket.loop.call_soon_threadsafe(ticket.on_tokens, list(seq.output_ids))
        for seq in done:
            ticket = self._tickets.pop(id(seq))
            assert seq.finish_reason is not None
            completion = Completion(
                seq.rid,
                seq.prompt_ids,
                list(seq.output_ids),
                seq.finish_reason,
                seq.verify_ct,
                time.monotonic() - seq.created,
                list(seq.accepted_drafts),
                seq.cached_tokens,
            )
            self.completed += 1
            self.completion_tokens += len(seq.output_ids)
            self.verify_ct += seq.verify_ct
            ticket.loop.call_soon_threadsafe(_resolve, ticket.future, completion)

    def _fail_all(self, exc: Exception) -> None:
        tickets = list(self._tickets.values())
        self._tickets.clear()
        self.engine.reset()
        for ticket in tickets:
            ticket.loop.call_soon_threadsafe(_fail, ticket.future, exc)


def _resolve(future: asyncio.Future[Completion], completion: Completion) -> None:
    if not future.done():
        future.set_result(completion)


def _fail(future: asyncio.Future[Completion], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
