"""Error types that retrying cannot help: damaged input (``DataError``) and a deliberate stop
(``Stopped``).

Prefect retries are for infrastructure (a server, a node, a disk that came back); a ``DataError`` (a
damaged shard, a non-finite training step, a source file that is not what its name says) fails its
unit at once, and its message (the file, what is wrong, what to do) is what the user reads last. The
unit task's retry condition and the CLI's exit-code table both key on this one type.
"""

from __future__ import annotations


class DataError(ValueError):
    """Input data is damaged or unusable; the message names the file (or rows), what is wrong and
    the fix."""


class Stopped(RuntimeError):
    """The work was stopped on purpose (SIGTERM, Ctrl-C); a retry would undo the stop, a re-run
    resumes it."""


# A worker process (``python -m eagle3.train``) prints a ``DataError`` as one line with this prefix
# and exits with ``DATA_ERROR_EXIT``, so the parent that reads its output raises the same
# ``DataError`` (not a retried failure).
DATA_ERROR_PREFIX = "eagle3 data error: "
DATA_ERROR_EXIT = 3
