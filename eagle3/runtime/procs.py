"""Child processes of the pipeline: free ports, servers and workers that never outlive the process
that started them, and helper threads that yield the CPU to a process's compute.

A reference server, an SGLang arm or a training worker left running after ``eagle3 run`` is killed
holds a port, a GPU and, on a laptop, both CPU cores; the next run then starts a second copy next to
it. ``die_with_parent`` is a ``preexec_fn`` asking Linux to SIGTERM the child when its parent dies
(``PR_SET_PDEATHSIG``), even on SIGKILL. Elsewhere it does nothing and an orphan is cleaned up by
its own next write to a closed pipe or by hand. How a run stops on a signal (its children first) is
``eagle3.runtime.stop``.

``yield_cpu`` is for the threads that decode and encode next to a compute step on the same CPU (the
loader's readers, the capture's writer): a step of several intra-op threads waits for the slowest
one, so a helper thread that takes a core from it costs the step about twice its own CPU time.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def yield_cpu() -> None:
    """Run the calling thread at the lowest CPU priority (nice 19), so it uses what the compute
    threads leave idle. Linux only (the nice value there is per thread; elsewhere it is the whole
    process's, so nothing changes)."""
    if sys.platform.startswith("linux"):
        os.setpriority(os.PRIO_PROCESS, 0, 19)


def die_with_parent() -> None:
    """``preexec_fn``: SIGTERM this child when the thread that spawned it dies (Linux; a no-op
    elsewhere).

    Spawn from a thread that outlives the child (the flow's thread, or a task thread that waits for
    it).
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def adopt_orphans() -> None:
    """Make this process the parent of its orphaned descendants (``PR_SET_CHILD_SUBREAPER``; Linux,
    a no-op elsewhere): a server's worker whose server died stays in this process's tree, where
    ``eagle3.runtime.stop.reap`` finds it, instead of moving to init."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
