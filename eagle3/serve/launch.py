"""Start the reference server as a subprocess for the length of a ``with`` block.

``ReferenceServer`` runs ``python -m eagle3.serve ...`` (same interpreter), waits for ``/health``, exposes
``.url``, and always stops the process on exit (SIGTERM, then SIGKILL after a grace period). ``port=0`` picks a
free port first. The server's output goes to a log file (``.log_path``) so a chatty server can never block on a
full pipe; its tail is in the error when it dies during start-up.
"""

from __future__ import annotations

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

from eagle3.procs import die_with_parent, free_port

logger = logging.getLogger(__name__)


class ServerStartError(RuntimeError):
    """The reference server exited or did not become healthy in time."""


def is_healthy(url: str, *, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class ReferenceServer:
    """Context manager around one reference-server process (see module docstring)."""

    def __init__(
        self,
        model_path: str | Path | None,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = 300.0,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.args = [sys.executable, "-m", "eagle3.serve", "--host", host, "--port", str(self.port)]
        if model_path is not None:
            self.args += ["--model", str(model_path)]
        self.args += list(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="eagle3-serve-", suffix=".log")[1])
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ReferenceServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        logger.info("starting reference server: %s (log %s)", " ".join(self.args), self.log_path)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env, preexec_fn=die_with_parent
            )
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            while not is_healthy(self.url):
                if self.proc.poll() is not None:
                    raise ServerStartError(
                        f"reference server exited with code {self.proc.returncode} during start-up:\n{self.log_tail()}"
                    )
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"reference server not healthy after {self.startup_timeout_s:.0f}s:\n{self.log_tail()}"
                    )
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        logger.info("reference server healthy at %s", self.url)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "<no log>"

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            logger.warning("reference server did not stop on SIGTERM in %.0fs; killing it", grace_s)
            self.proc.kill()
            self.proc.wait()
