"""Stopping a run: one process-wide stop state, the child processes the library starts, and a reaper
that leaves no descendant behind.

A terminal's Ctrl-C sends SIGINT to its whole foreground process group; systemd, Kubernetes, Slurm
and Prefect's workers stop a job by signalling its group (SIGTERM). How the pipeline stops:

- ``stop_on_signals`` installs one handler for SIGINT and SIGTERM (main thread only). A signal calls
  ``request_stop``: the stop is recorded (``stop_requested``), the callbacks registered with
  ``on_stop`` run (regen cancels its running shards, which flush their journals) and every child
  started with ``spawn`` gets SIGTERM on its whole process group. Then the handler hands the signal
  on to the handler it replaced (Prefect's, which marks the flow run Crashed; ``KeyboardInterrupt``
  for SIGINT; ``SystemExit(128 + signal)`` for SIGTERM), which unwinds the main thread: at once, or,
  inside a ``deferred`` block (a stage waiting for its units), where the block next polls.
- Work on other threads stops at its next check: ``raise_if_stopped`` (a unit about to start, a gate
  level, a capture batch, a server or worker about to start, the gate's promotion) raises
  ``Stopped``, which is never retried. A unit waiting for a child sees it exit and raises
  ``Stopped`` as well, not a failure to retry.
- Children started by ``spawn`` lead a process group of their own: a signal to the pipeline's group
  reaches only the pipeline's process, which records the stop before it stops them (a training
  worker killed first would look like a crash to retry). They also die with the pipeline's process
  on ``kill -9`` (``die_with_parent``).
- ``reap`` ends whatever else descends from the process (Ray's daemons, a server's own workers, a
  process whose parent died: after ``adopt_orphans`` they are re-parented to this process, so they
  stay in its tree): SIGTERM, then SIGKILL after ``CHILD_GRACE_S``.
- With ``exit_within_s`` the process is sure to end: a second SIGINT (Ctrl-C twice), or that many
  seconds after the first signal, every descendant gets SIGKILL and the process exits ``128 +
  signal`` at once. The pipeline's files survive ``kill -9`` (journals, part files, checkpoints;
  manifests are written last), so nothing finished is lost.

The state is cleared when the outermost ``stop_on_signals`` block ends, so a process that runs
several flows (a Prefect worker, the tests) starts each one unstopped.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from eagle3.errors import Stopped
from eagle3.runtime.procs import die_with_parent

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
CHILD_GRACE_S = 10.0  # a child's time to exit on SIGTERM before SIGKILL


@dataclass(frozen=True)
class StopRequest:
    """Why the run stops (``reason``: "SIGINT", "SIGTERM" or what failed), its signal, and when."""

    reason: str
    signum: int | None = None
    at: float = 0.0

    @property
    def exit_code(self) -> int:
        """``128 + signal`` (130 for SIGINT, 143 for SIGTERM); 1 for a stop no signal asked for."""
        return 128 + self.signum if self.signum else 1


# re-entrant: a signal handler may run on the main thread while that thread holds the lock
_lock = threading.RLock()
_request: StopRequest | None = None
_callbacks: list[Callable[[StopRequest], None]] = []
_children: set[subprocess.Popen[Any]] = set()
_installed = 0  # nesting depth of stop_on_signals blocks
_deadline_s: float | None = None  # the outermost block's exit_within_s
_sigints = 0
_deferring = 0  # depth of deferred stop_on_signals blocks
_pending: tuple[Any, int] | None = None  # a deferred signal: (the handler it replaced, the signal)


def stop_requested() -> StopRequest | None:
    """The stop under way, or None."""
    return _request


def raise_if_stopped(what: str) -> None:
    """Raise ``Stopped`` naming ``what`` (e.g. "capture shard 3") once a stop was requested."""
    request = _request
    if request is not None:
        raise Stopped(f"{what} stopped by {request.reason}; a re-run resumes it")


def request_stop(reason: str, signum: int | None = None) -> StopRequest:
    """Record the stop (the first request wins; later ones return it), run the ``on_stop`` callbacks
    and SIGTERM every running child of ``spawn`` on its process group. Never blocks: callable from a
    signal handler."""
    global _request
    with _lock:
        if _request is not None:
            return _request
        request = _request = StopRequest(reason, signum, time.monotonic())
        callbacks, children = list(_callbacks), [proc for proc in _children if proc.poll() is None]
    logger.warning(
        "%s: stopping the run (no new unit starts; %d child process(es) stopped)",
        reason,
        len(children),
    )
    for callback in callbacks:
        try:
            callback(request)
        except Exception:  # a failing callback must not spare the others, nor the children
            logger.exception("a stop callback failed")
    for proc in children:
        signal_group(proc, signal.SIGTERM)
    if _deadline_s is not None:
        threading.Thread(
            target=_exit_after, args=(request, _deadline_s), name="stop-deadline", daemon=True
        ).start()
    return request


@contextmanager
def on_stop(callback: Callable[[StopRequest], None]) -> Iterator[None]:
    """Call ``callback`` (quick, non-blocking) when a stop is requested during the block; at once if
    one already was."""
    with _lock:
        _callbacks.append(callback)
        request = _request
    if request is not None:
        callback(request)
    try:
        yield
    finally:
        with _lock:
            _callbacks.remove(callback)


def spawn(argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **popen_kwargs)`` for a child the stop owns: it leads its own
    process group, dies with the thread that spawns it (spawn from one that outlives it) and gets
    SIGTERM on its group when a stop is requested. Raises ``Stopped`` instead of starting once a
    stop was requested."""
    raise_if_stopped(f"starting {Path(argv[0]).name}")
    proc = subprocess.Popen(
        list(argv), start_new_session=True, preexec_fn=die_with_parent, **popen_kwargs
    )
    with _lock:
        _children.difference_update([child for child in _children if child.poll() is not None])
        _children.add(proc)
        request = _request
    if request is not None:  # it started as request_stop looked at the children: it missed them
        signal_group(proc, signal.SIGTERM)
        raise Stopped(f"{Path(argv[0]).name} stopped by {request.reason} as it started")
    return proc


def signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    """Send ``sig`` to the process group ``proc`` leads (``spawn``'s children), else to ``proc``."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def stop_child(
    proc: subprocess.Popen[Any], *, grace_s: float = CHILD_GRACE_S, name: str = ""
) -> None:
    """Stop ``proc`` and its process group: SIGTERM, then SIGKILL after ``grace_s``; returns once it
    exited."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        signal_group(proc, sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            logger.warning(
                "%s ignored %s for %.0f s", name or proc.args, signal.Signals(sig).name, wait_s
            )


def reap(grace_s: float = CHILD_GRACE_S) -> list[str]:
    """End every descendant of this process (SIGTERM, SIGKILL after ``grace_s``; 0: SIGKILL at once)
    and collect them; returns their names, e.g. ``["raylet (4242)"]``, for a log line."""
    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    alive = [p for p in procs if _running(p)]
    names = [_describe(p) for p in alive]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not alive or (sig == signal.SIGTERM and grace_s <= 0):
            continue
        for proc in alive:
            with suppress(psutil.Error):
                proc.send_signal(sig)
        _, alive = psutil.wait_procs(alive, timeout=wait_s)
    return names


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.name()} ({proc.pid})"
    except psutil.Error:
        return str(proc.pid)


@contextmanager
def stop_on_signals(
    *, exit_within_s: float | None = None, deferred: bool = False
) -> Iterator[None]:
    """SIGINT and SIGTERM stop the run (``request_stop``), then go on to the handlers they replaced,
    for the block (main thread only; elsewhere the block runs without it). A signal whose handler is
    already this one is left as it is, so nested blocks stop once; so is an ignored one.
    ``exit_within_s`` (a command's outermost block, the process ending after it) makes the exit
    certain: a second SIGINT, or that many seconds after the stop (the deadline stays armed after
    the block, for the process's own exit), SIGKILLs every descendant and exits ``128 + signal``.

    ``deferred``: inside the block a signal only requests the stop; the replaced handler's exception
    (``KeyboardInterrupt``, Prefect's ``TerminationSignal``) is raised by ``raise_pending_stop``,
    which the block calls where it polls, or when the block ends. An exception raised by a handler
    lands wherever the main thread is, and inside ``threading.Condition.wait`` (a future's result, a
    Prefect API call) it leaves the condition's lock released ("RuntimeError: release unlocked
    lock"): the flow run then fails instead of crashing."""
    global _installed, _deadline_s, _request, _sigints, _deferring, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # a signal ignored at the start stays ignored (``cmd &`` in a script: the terminal's Ctrl-C is
    # not for it), and one already handled here is left as it is
    current = {sig: signal.getsignal(sig) for sig in SIGNALS}
    replaced = {sig: h for sig, h in current.items() if h != signal.SIG_IGN and not _is_ours(h)}

    def handler(signum: int, frame: FrameType | None) -> None:
        global _sigints, _pending
        # counted first: a second Ctrl-C can run this handler while the first one is still running
        _sigints += signum == signal.SIGINT
        request = request_stop(signal.Signals(signum).name, signum)
        if _sigints > 1 and _deadline_s is not None:
            _exit_now(request, "a second Ctrl-C")
        before = replaced.get(signal.Signals(signum), signal.SIG_DFL)
        if _deferring:
            _pending = _pending or (before, signum)
        else:
            _hand_on(before, signum, frame)

    handler._eagle3_stop = True  # type: ignore[attr-defined]
    with _lock:
        _installed += 1
        if _installed == 1:
            _deadline_s = exit_within_s
        _deferring += deferred
    for sig in replaced:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, before in replaced.items():
            signal.signal(sig, before)
        with _lock:
            _deferring -= deferred
            _installed -= 1
            pending = _pending if deferred and not _deferring else None
            if pending is not None or _installed == 0:
                _pending = None
            if _installed == 0:
                _request, _deadline_s, _sigints = None, None, 0
        if pending is not None:  # even while an error propagates: the signal says why it stopped
            _hand_on(pending[0], pending[1], None)


def raise_pending_stop() -> None:
    """Raise what a signal deferred by ``stop_on_signals(deferred=True)`` would have raised (nothing
    when none came): call it from the main thread where it polls, outside any lock."""
    global _pending
    pending, _pending = _pending, None
    if pending is not None:
        _hand_on(pending[0], pending[1], None)


def _is_ours(handler: object) -> bool:
    return bool(getattr(handler, "_eagle3_stop", False))


def _hand_on(before: Any, signum: int, frame: FrameType | None) -> None:
    """What the replaced handler does: call it; for the default action, ``KeyboardInterrupt`` on
    SIGINT and ``SystemExit(128 + signal)`` otherwise, so ``finally`` blocks run (the default would
    end the process at once)."""
    if callable(before):
        before(signum, frame)
    elif before == signal.SIG_DFL or before is None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)


def _exit_after(request: StopRequest, deadline_s: float) -> None:
    time.sleep(max(0.0, request.at + deadline_s - time.monotonic()))
    _exit_now(request, f"the stop took longer than {deadline_s:.0f} s")


def _exit_now(request: StopRequest, why: str) -> None:
    """SIGKILL every descendant and exit ``request.exit_code`` now, without unwinding (safe: the
    pipeline's files survive ``kill -9``)."""
    killed = reap(grace_s=0)
    sys.stderr.write(
        f"{why}: exiting now ({request.reason}); killed {', '.join(killed) or 'no process'}\n"
    )
    sys.stderr.flush()
    os._exit(request.exit_code)
