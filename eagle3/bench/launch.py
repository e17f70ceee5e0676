"""Server launch commands generated from config, never hand-typed (DESIGN §5), and a managed server process.

Design choices:
- One function builds every arm. The arms share one argument list (model, tp, dtype, context length, memory
  fraction, max running requests, CUDA graph batch size, extra args) and the speculative arm only appends the five
  ``--speculative-*`` flags, so "baseline and speculative differ only in speculation" holds by construction;
  preflight still diffs the two lists in case either was edited by hand.
- Flag spellings are those of the pinned SGLang (``SGLANG_VERSION``, the ``sglang`` extra). In 0.5.23 the CUDA graph
  cap is ``--cuda-graph-max-bs-decode`` (the older ``--cuda-graph-max-bs`` is gone; argparse would reject it as an
  ambiguous prefix) and tensor parallelism is ``--tp-size``.
- Two flavours: ``sglang`` (``python -m sglang.launch_server``) and ``reference`` (``python -m eagle3.serve``, the
  project's CPU server). The reference flavour carries the same model, context, batch and speculative flags;
  GPU/Hub-only flags (tp, memory fraction, CUDA graphs, revision, remote code, extra args) are SGLang's alone and
  are left out, identically for both arms.
- ``ServerProcess`` starts a command in its own process group, waits for ``GET /health`` and always stops the
  whole group (SIGTERM, then SIGKILL) on exit or error, so no server outlives the command that started it.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

from eagle3.config import PipelineConfig, SpeculativeConfig
from eagle3.procs import die_with_parent, free_port

logger = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.23"
Arm = Literal["baseline", "eagle3"]
Flavour = Literal["sglang", "reference"]
ARMS: tuple[str, ...] = ("baseline", "eagle3")
FLAVOURS: tuple[str, ...] = ("sglang", "reference")
MODULES: dict[str, str] = {"sglang": "sglang.launch_server", "reference": "eagle3.serve"}

ALGORITHM_FLAG = "--speculative-algorithm"
DRAFT_FLAG = "--speculative-draft-model-path"
SPECULATIVE_FLAGS: tuple[str, ...] = (
    ALGORITHM_FLAG,
    DRAFT_FLAG,
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
)
# Flags whose value differs per launch by design (where the server listens), ignored when arms are compared.
ADDRESS_FLAGS: tuple[str, ...] = ("--host", "--port")


class LaunchError(RuntimeError):
    """A server could not be launched or did not become healthy; the message says why and where the log is."""


@dataclass(frozen=True)
class LaunchCommand:
    """One server launch: ``argv`` starts with ``python -m <module>``; ``url`` is where it will listen."""

    arm: str
    flavour: str
    argv: list[str]
    host: str
    port: int
    draft: str | None = None
    speculative: dict[str, int | str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def shell(self) -> str:
        return shlex.join(self.argv)

    def process_argv(self) -> list[str]:
        """The argv to execute here: ``python`` replaced by this interpreter (the one with the packages)."""
        return [sys.executable, *self.argv[1:]]

    def server_args(self) -> list[str]:
        """The arguments after ``python -m <module>`` (what the server's own parser sees)."""
        return self.argv[3:]


def _served_dtype(config: PipelineConfig, flavour: str) -> str:
    if config.server.dtype != "auto" or flavour == "sglang":
        return config.server.dtype
    return config.target.dtype


def shared_args(config: PipelineConfig, flavour: str, *, host: str, port: int) -> list[str]:
    """Flags every arm of one flavour carries, in a fixed order."""
    server, target = config.server, config.target
    args = ["--model-path", target.model_path]
    if flavour == "sglang" and target.revision:
        args += ["--revision", target.revision]
    if flavour == "sglang" and target.trust_remote_code:
        args.append("--trust-remote-code")
    args += ["--dtype", _served_dtype(config, flavour)]
    args += ["--context-length", str(server.context_length or target.context_length)]
    if server.max_running_requests is not None:
        args += ["--max-running-requests", str(server.max_running_requests)]
    if flavour == "sglang":
        args += ["--tp-size", str(server.tp)]
        if server.mem_fraction_static is not None:
            args += ["--mem-fraction-static", str(server.mem_fraction_static)]
        if server.cuda_graph_max_bs is not None:
            args += ["--cuda-graph-max-bs-decode", str(server.cuda_graph_max_bs)]
        args += list(server.extra_args)
    args += ["--host", host, "--port", str(port)]
    return args


def speculative_args(spec: SpeculativeConfig, draft: str) -> list[str]:
    """The five speculative flags (DESIGN §5: set all of steps/topk/draft tokens, never some)."""
    return [
        ALGORITHM_FLAG,
        spec.algorithm,
        DRAFT_FLAG,
        draft,
        "--speculative-num-steps",
        str(spec.num_steps),
        "--speculative-eagle-topk",
        str(spec.eagle_topk),
        "--speculative-num-draft-tokens",
        str(spec.num_draft_tokens),
    ]


def build_launch(
    config: PipelineConfig,
    arm: str,
    *,
    flavour: str = "sglang",
    draft: str | Path | None = None,
    speculative: SpeculativeConfig | None = None,
    port: int | None = None,
) -> LaunchCommand:
    """The launch command of one arm. ``speculative`` defaults to ``config.speculative``; port 0 picks a free one."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}: use one of {list(ARMS)}")
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown flavour {flavour!r}: use one of {list(FLAVOURS)}")
    host = config.server.host
    port = config.server.port if port is None else port
    port = port or free_port(host)
    argv = ["python", "-m", MODULES[flavour], *shared_args(config, flavour, host=host, port=port)]
    if arm == "baseline":
        return LaunchCommand(arm, flavour, argv, host, port)
    if draft is None:
        raise ValueError("the eagle3 arm needs a draft: pass --draft <export dir> (an SGLang-ready draft directory)")
    spec = speculative or config.speculative
    draft_path = str(Path(draft).expanduser().resolve()) if Path(draft).expanduser().exists() else str(draft)
    argv += speculative_args(spec, draft_path)
    return LaunchCommand(arm, flavour, argv, host, port, draft=draft_path, speculative=spec.model_dump(mode="json"))


def split_speculative(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split server args into the non-speculative ones and a ``{flag: value}`` dict of ``--speculative-*`` flags."""
    shared: list[str] = []
    spec: dict[str, str] = {}
    i = 0
    while i < len(args):
        token = args[i]
        name, eq, inline = token.partition("=")
        if name.startswith("--speculative-"):
            if eq:
                spec[name] = inline
                i += 1
            else:
                spec[name] = args[i + 1] if i + 1 < len(args) else ""
                i += 2
            continue
        shared.append(token)
        i += 1
    return shared, spec


def without_address(args: list[str]) -> list[str]:
    """``args`` without ``--host``/``--port`` and their values (where a server listens is not a served setting)."""
    out: list[str] = []
    skip = False
    for token in args:
        if skip:
            skip = False
            continue
        name = token.partition("=")[0]
        if name in ADDRESS_FLAGS:
            skip = "=" not in token
            continue
        out.append(token)
    return out


def parse_with_sglang(args: list[str]):  # -> argparse.Namespace
    """Parse server args with the pinned SGLang's own parser (needs the ``sglang`` extra importable).

    Raises ``SystemExit`` (argparse's way) on an unknown flag or a bad value, ``ImportError`` without SGLang.
    """
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(args)


def _get_ok(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


class ServerProcess:
    """Context manager: start a launch command, wait for ``/health``, stop the process group on exit.

    The server's stdout/stderr go to ``log_path`` (a temp file next to nothing when not given); a server that exits
    or stays unhealthy past ``health_timeout_s`` raises ``LaunchError`` with the tail of its log.
    """

    def __init__(
        self,
        command: LaunchCommand,
        *,
        log_path: Path | None = None,
        health_timeout_s: float = 300.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.command = command
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/eagle3-{command.arm}-{command.port}.log")
        self.health_timeout_s = health_timeout_s
        self.env = {**os.environ, **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.command.url

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logger.info("starting %s arm: %s", self.command.arm, self.command.shell())
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                self.command.process_argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
                env=self.env,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        logger.info("%s arm healthy at %s", self.command.arm, self.url)
        return self

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.health_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise LaunchError(
                    f"{self.command.arm} server exited with code {self._proc.returncode} before it was healthy; "
                    f"fix the error in its log {self.log_path}:\n{self.log_tail()}"
                )
            if _get_ok(f"{self.url}/health", timeout_s=2.0):
                return
            time.sleep(0.2)
        raise LaunchError(
            f"{self.command.arm} server not healthy after {self.health_timeout_s:.0f}s at {self.url}/health; "
            f"raise the timeout or read its log {self.log_path}:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait(self) -> int:
        """Block until the server exits (used by ``launch-sglang --run``)."""
        assert self._proc is not None
        return self._proc.wait()

    def stop(self, timeout_s: float = 15.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                logger.warning("%s server ignored %s, escalating", self.command.arm, sig.name)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
