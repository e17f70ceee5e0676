"""Children started with ``die_with_parent`` do not outlive a SIGKILLed parent (Linux)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from eagle3.runtime.procs import free_port

PARENT = """
import subprocess, sys, time
from eagle3.runtime.procs import die_with_parent
kwargs = {"preexec_fn": die_with_parent} if sys.argv[1] == "guarded" else {}
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], **kwargs)
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie waiting for init to reap it is dead too
        return fh.read().split(") ")[1][0] != "Z"


def _orphan_survives(mode: str) -> bool:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 3
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    survived = _alive(child)
    if survived:
        os.kill(child, signal.SIGKILL)
    return survived


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_guarded_child_dies_with_its_killed_parent_and_an_unguarded_one_survives():
    assert not _orphan_survives("guarded")
    assert _orphan_survives("unguarded")


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's"
)
def test_yield_cpu_lowers_only_the_calling_thread():
    import threading

    from eagle3.runtime.procs import yield_cpu

    mine, seen = os.getpriority(os.PRIO_PROCESS, 0), []

    def helper() -> None:
        yield_cpu()
        seen.append(os.getpriority(os.PRIO_PROCESS, 0))

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()
    assert seen == [19] and os.getpriority(os.PRIO_PROCESS, 0) == mine
