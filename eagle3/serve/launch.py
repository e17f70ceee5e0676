"""Start a server as a child process for the length of a ``with`` block: the one launcher of the
project.

The reference server (regen, tests, benchmarks) and both SGLang arms of the gate start through
``ServerProcess``, so there is one health poll, one error and one way to stop a server. It lives in
``serve``, below the gate and regen; the commands it launches are built by
``eagle3.serve.launch_commands``.

Design choices:
- The launcher owns where a server listens: it appends ``--host``/``--port`` (the spelling both
``eagle3.serve.reference`` and
  ``sglang.launch_server`` take) and picks a free port for port 0, so tests and the regen stage
  never choose one.
- The child is started by ``eagle3.runtime.stop.spawn``: it dies with its parent and runs in its own
  process group, which is stopped as a whole (SIGTERM, then SIGKILL) on exit, on error and as soon
  as the run is stopped (Ctrl-C, SIGTERM): no server, nor a worker it spawned, outlives the command
  that started it.
- Output goes to a log file, never a pipe, so a chatty server cannot block on a full pipe; a server
  that exits or stays unhealthy during start-up raises ``LaunchError`` naming the log and quoting
  its tail.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from eagle3.rundir.runroot import atomic_write_json
from eagle3.runtime.procs import free_port
from eagle3.runtime.stop import raise_if_stopped, spawn, stop_child

logger = logging.getLogger(__name__)


class LaunchError(RuntimeError):
    """A server exited or did not become healthy in time; the message names its log and quotes the
    tail."""


def is_healthy(url: str, *, timeout_s: float = 2.0) -> bool:
    """``GET <url>/health`` answers 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class ServerProcess:
    """Context manager around one server process (see module docstring); ``.url`` is where it
    listens."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "server",
        log_path: Path | None = None,
        health_timeout_s: float = 300.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.argv = [*argv, "--host", host, "--port", str(self.port)]
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="eagle3-server-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        self.log_path = Path(log_path)
        self.health_timeout_s = health_timeout_s
        self.env = {**os.environ, **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The server's pid (it leads its own process group), once started."""
        return None if self._proc is None else self._proc.pid

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the process and return once ``/health`` answers; stop it and raise ``LaunchError``
        otherwise."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logger.info("starting %s: %s (log %s)", self.name, " ".join(self.argv), self.log_path)
        with open(self.log_path, "ab") as log:
            self._proc = spawn(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        try:
            self._wait_healthy(self._proc)
            self._record_server_info()
        except BaseException:
            self.stop()
            raise
        logger.info("%s healthy at %s", self.name, self.url)

    def _record_server_info(self) -> None:
        """A server that logs requests into directories (``--log-requests-target``) gets its
        ``/server_info`` written beside its logs: its traffic says which model answered it."""
        from eagle3.data.served_log import SERVER_INFO_FILE, log_dirs

        dirs = log_dirs(self.argv)
        if not dirs:
            return
        with urllib.request.urlopen(f"{self.url}/server_info", timeout=30) as resp:
            info = json.loads(resp.read())
        for directory in dirs:
            atomic_write_json(Path(directory) / SERVER_INFO_FILE, info)

    def _wait_healthy(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.health_timeout_s
        while not is_healthy(self.url):
            raise_if_stopped(f"starting {self.name}")
            if proc.poll() is not None:
                raise LaunchError(
                    f"{self.name} exited with code {proc.returncode} before it was healthy; "
                    f"fix the error in its log {self.log_path}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"{self.name} not healthy after {self.health_timeout_s:.0f}s at {self.url}/health; "
                    f"raise the timeout or read its log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"

    def wait(self, timeout_s: float | None = None) -> int:
        """Block until the server exits on its own; its exit code."""
        if self._proc is None:
            raise RuntimeError(f"{self.name} was not started")
        return self._proc.wait(timeout=timeout_s)

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after ``grace_s``."""
        if self._proc is not None:
            stop_child(self._proc, grace_s=grace_s, name=self.name)


def reference_server(
    model_path: str | Path | None,
    *,
    extra_args: Sequence[str] = (),
    log_path: Path | None = None,
    health_timeout_s: float = 300.0,
) -> ServerProcess:
    """The project's reference server (``python -m eagle3.serve.reference`` in this interpreter) on
    a free local port.

    ``model_path`` None is for ``--synthetic-tokens`` (no model) in ``extra_args``.
    """
    argv = [sys.executable, "-m", "eagle3.serve.reference"]
    if model_path is not None:
        argv += ["--model", str(model_path)]
    return ServerProcess(
        [*argv, *extra_args],
        name="reference server",
        log_path=log_path,
        health_timeout_s=health_timeout_s,
    )
