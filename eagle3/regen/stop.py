"""Stop running regen shards within seconds when the run stops (SIGTERM, Ctrl-C), their journals
flushed.

Shards run on worker threads, each in its own event loop, and a signal reaches only the main thread,
which then waits for the workers' thread pool to finish every running shard (minutes to hours
against a dead server) unless the shards stop themselves. ``shards_stop_with_the_run`` (entered by
the regen stage's ``resources``) registers ``stop_running_shards`` with the run's stop
(``eagle3.runtime.stop``): it cancels every running shard's task (``running_shard`` registers it); a
cancelled shard cancels its requests, closes its journal (fsync) and raises ``ShardStopped``; a
shard that starts after the stop fails at once the same way.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eagle3.errors import Stopped
from eagle3.runtime.stop import StopRequest, on_stop, stop_requested

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_running: dict[asyncio.Task[Any], asyncio.AbstractEventLoop] = {}


class ShardStopped(Stopped):
    """A shard was stopped by a signal; what finished is journaled and a re-run resumes it."""


def stop_running_shards(request: StopRequest) -> None:
    """Cancel every registered shard task (from any thread, without waiting for them)."""
    with _lock:
        running = list(_running.items())
    for task, loop in running:
        loop.call_soon_threadsafe(task.cancel)
    if running:
        logger.warning(
            "%s: stopping %d running regen shards (journals are flushed)",
            request.reason,
            len(running),
        )


@contextmanager
def running_shard(index: int) -> Iterator[None]:
    """Register the current task as shard ``index`` for the block; a stop turns its cancellation
    into ``ShardStopped``."""
    task = asyncio.current_task()
    assert task is not None, "running_shard needs a running task"
    with _lock:
        request = stop_requested()
        if request is not None:
            raise ShardStopped(f"regen shard {index} not started: {request.reason}")
        _running[task] = asyncio.get_running_loop()
    try:
        yield
    except asyncio.CancelledError:
        request = stop_requested()
        if request is None:
            raise
        raise ShardStopped(
            f"regen shard {index} stopped by {request.reason}; its journal is flushed and a re-run "
            "resumes it"
        ) from None
    finally:
        with _lock:
            _running.pop(task, None)


@contextmanager
def shards_stop_with_the_run() -> Iterator[None]:
    """Running shards are cancelled when the run stops during the block."""
    with on_stop(stop_running_shards):
        yield
