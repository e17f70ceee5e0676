"""Child processes of the pipeline: free ports, and servers and workers that never outlive the process that started
them.

A reference server, an SGLang arm or a training worker left running after ``eagle3 run`` is killed holds a port,
a GPU and, on a laptop, both CPU cores; the next run then starts a second copy next to it. ``die_with_parent`` is a
``preexec_fn`` asking Linux to SIGTERM the child when its parent dies (``PR_SET_PDEATHSIG``), even on SIGKILL.
Elsewhere it does nothing and an orphan is cleaned up by its own next write to a closed pipe or by hand.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import sys

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def die_with_parent() -> None:
    """``preexec_fn``: SIGTERM this child when the thread that spawned it dies (Linux; a no-op elsewhere).

    Spawn from a thread that outlives the child (the flow's thread, or a task thread that waits for it).
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
