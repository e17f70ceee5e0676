"""Stop running regen shards on SIGTERM or Ctrl-C within seconds, their journals flushed.

Shards run on worker threads, each in its own event loop, and a signal reaches only the main thread: there, the
default SIGTERM ends the process without flushing anything, and Prefect's handler or a ``KeyboardInterrupt`` only
unwinds the main thread, which then waits for the workers' thread pool to finish every running shard (minutes to
hours against a dead server). ``stop_shards_on_signals`` (entered by the regen stage's ``resources``, in the main
thread) installs a handler that first cancels every running shard's task (``running_shard`` registers it): a
cancelled shard cancels its requests, closes its journal (fsync) and raises ``ShardStopped``; then the handler hands
the signal on to the handler it replaced (Prefect's, ``KeyboardInterrupt``, or exit status 128 + signal).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from eagle3.errors import Stopped

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_running: dict[asyncio.Task[Any], asyncio.AbstractEventLoop] = {}
_stopping: list[str] = []  # the reason, while a stop is under way


class ShardStopped(Stopped):
    """A shard was stopped by a signal; what finished is journaled and a re-run resumes it."""


def stop_running_shards(reason: str) -> None:
    """Cancel every registered shard task (from any thread); shards started until the stop ends fail at once."""
    with _lock:
        _stopping[:] = [reason]
        running = list(_running.items())
    for task, loop in running:
        loop.call_soon_threadsafe(task.cancel)
    if running:
        logger.warning("%s: stopping %d running regen shards (journals are flushed)", reason, len(running))


@contextmanager
def running_shard(index: int) -> Iterator[None]:
    """Register the current task as shard ``index`` for the block; a stop turns its cancellation into
    ``ShardStopped``."""
    task = asyncio.current_task()
    assert task is not None, "running_shard needs a running task"
    with _lock:
        if _stopping:
            raise ShardStopped(f"regen shard {index} not started: {_stopping[0]}")
        _running[task] = asyncio.get_running_loop()
    try:
        yield
    except asyncio.CancelledError:
        with _lock:
            reason = _stopping[0] if _stopping else None
        if reason is None:
            raise
        raise ShardStopped(
            f"regen shard {index} stopped by {reason}; its journal is flushed and a re-run resumes it"
        ) from None
    finally:
        with _lock:
            _running.pop(task, None)


@contextmanager
def stop_shards_on_signals() -> Iterator[None]:
    """SIGTERM and SIGINT stop the running shards, then go on to the handlers they replaced (main thread only;
    elsewhere the block runs without it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: FrameType | None) -> None:
        stop_running_shards(signal.Signals(signum).name)
        before = previous[signal.Signals(signum)]
        if callable(before):
            before(signum, frame)
        elif before == signal.SIG_DFL:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)
        with _lock:
            _stopping.clear()
