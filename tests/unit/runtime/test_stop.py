"""A run stops on SIGINT/SIGTERM to its process group: its children first, the exception where it
polls, a certain exit; no child starts and nothing is promoted once it is stopping
(``eagle3.runtime.stop``).

The signals go to a script in a process group of its own, as a terminal's Ctrl-C or a job
scheduler's stop sends them, never to the test process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from eagle3.errors import Stopped
from eagle3.runtime.stop import (
    on_stop,
    raise_if_stopped,
    request_stop,
    spawn,
    stop_on_signals,
    stop_requested,
)

LINUX = sys.platform.startswith("linux")
pytestmark = pytest.mark.skipif(not LINUX, reason="process groups and subreapers")

REPO = Path(__file__).resolve().parents[3]

# A run with one child that polls, as flows.stage does: the child's exit is seen before the deferred
# exception.
POLLING = """
import sys, threading, time
from eagle3.runtime.stop import raise_pending_stop, spawn, stop_on_signals, stop_requested
with stop_on_signals(deferred=True):
    child = spawn([sys.executable, "-c", "import time; time.sleep(120)"])
    print(child.pid, flush=True)
    while True:
        threading.Event().wait(0.05)  # a signal raising inside this wait would break its lock
        if child.poll() is not None:
            print("child", child.returncode, "stop", stop_requested().reason, flush=True)
        raise_pending_stop()
"""

# A run whose main thread never polls (a long step in the main thread) and whose child ignores
# SIGTERM.
STUCK = """
import subprocess, sys, time
from eagle3.runtime.stop import on_stop, spawn, stop_on_signals
with stop_on_signals(exit_within_s=float(sys.argv[1]), deferred=True):
    child = spawn(["sh", "-c", "trap '' TERM; echo ready; exec sleep 120"], stdout=subprocess.PIPE)
    child.stdout.readline()  # SIGTERM is ignored from now on
    print(child.pid, flush=True)
    with on_stop(lambda request: print("stopping", request.reason, flush=True)):
        time.sleep(120)
"""

# A child that starts a grandchild and exits at once: the grandchild is an orphan.
ORPHANS = """
import subprocess, sys, time
from eagle3.runtime.procs import adopt_orphans
from eagle3.runtime.stop import reap
adopt_orphans()
out = subprocess.run(["sh", "-c", "sleep 120 >/dev/null 2>&1 & echo $!"], capture_output=True,
                     text=True)
print(out.stdout.strip(), flush=True)
sys.stdin.readline()
print(reap(grace_s=5), flush=True)
"""


def _start(script: str, *args: str, sigint: object = signal.SIG_DFL) -> subprocess.Popen[str]:
    """``script`` in a process group of its own, SIGINT's action set to ``sigint`` (the default one
    unless asked: tests running as a script's background job start with SIGINT ignored)."""
    argv = [sys.executable, "-c", script, *args]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
    return subprocess.Popen(
        argv,
        **pipes,
        text=True,
        cwd=REPO,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_group_signal_stops_the_children_first_and_raises_where_the_run_polls():
    run = _start(POLLING)
    assert run.stdout is not None
    child = int(run.stdout.readline())
    # the child leads its own group: the signal below does not reach it
    assert os.getpgid(child) == child != os.getpgid(run.pid)
    os.killpg(run.pid, signal.SIGTERM)
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGTERM
    # stopped by the run itself, and seen before the run raised
    assert f"child {-signal.SIGTERM} stop SIGTERM" in out
    assert _gone(child)


def test_a_run_started_with_sigint_ignored_ignores_ctrl_c_and_still_stops_on_sigterm():
    run = _start(POLLING, sigint=signal.SIG_IGN)  # as `eagle3 run &` in a script starts it
    assert run.stdout is not None
    child = int(run.stdout.readline())
    os.killpg(run.pid, signal.SIGINT)
    os.killpg(run.pid, signal.SIGTERM)
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGTERM and "stop SIGTERM" in out and _gone(child)


def test_a_second_ctrl_c_kills_what_is_left_and_exits_at_once():
    run = _start(STUCK, "600")
    assert run.stdout is not None
    child = int(run.stdout.readline())
    # the child ignores the SIGTERM it gets; the main thread never polls
    os.killpg(run.pid, signal.SIGINT)
    assert run.stdout.readline() == "stopping SIGINT\n"
    assert run.poll() is None and not _gone(child)
    os.killpg(run.pid, signal.SIGINT)
    assert run.wait(timeout=60) == 128 + signal.SIGINT
    assert _gone(child)


def test_a_stop_that_does_not_end_by_itself_ends_at_the_deadline():
    run = _start(STUCK, "1")
    assert run.stdout is not None
    child = int(run.stdout.readline())
    os.killpg(run.pid, signal.SIGTERM)
    assert run.wait(timeout=60) == 128 + signal.SIGTERM  # long before the 120 s the script sleeps
    assert _gone(child)


def test_reap_ends_an_orphaned_grandchild_the_process_adopted():
    run = _start(ORPHANS)
    assert run.stdout is not None and run.stdin is not None
    grandchild = int(run.stdout.readline())
    assert psutil.Process(grandchild).ppid() == run.pid  # re-parented to the run, not to init
    run.stdin.write("\n")
    run.stdin.flush()
    out, _ = run.communicate(timeout=60)
    assert f"sleep ({grandchild})" in out and _gone(grandchild)


def test_once_stopping_no_child_starts_and_every_check_raises_with_the_reason():
    seen = []
    with stop_on_signals(), on_stop(lambda request: seen.append(request.reason)):
        request_stop("a test")
        request_stop("a second request")  # the first one wins
        with pytest.raises(Stopped, match=r"starting python.* stopped by a test"):
            spawn([sys.executable, "-c", "pass"])
        with pytest.raises(Stopped, match="capture shard 3 stopped by a test"):
            raise_if_stopped("capture shard 3")
        with on_stop(lambda request: seen.append("late")):  # after the stop: called at once
            pass
    assert seen == ["a test", "late"]
    assert stop_requested() is None  # cleared with the outermost block: the next run starts afresh
