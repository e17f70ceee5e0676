"""End-to-end helpers (imported by ``conftest.py`` and the e2e tests): a real Prefect server on a
free port with a fresh PREFECT_HOME, REST helpers, a worker, the ``eagle3`` CLI as a subprocess,
headless Chromium screenshots.

Every child process gets the same environment (``e2e_env``): telemetry off, the API and UI URLs of
this server, and the session's EAGLE3_HOME so the tiny world built once is reused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"

# Overrides that keep a tiny pipeline run to a couple of minutes on 2 cores (fewer epochs, prompts
# and tokens). The gate keeps the recipe's traffic profile (concurrency 1 and 4: the night's report
# shows both levels, the crossover and the adaptive config) with half the tokens per request, which
# keeps its wall time that of a single level at full length (1.01x, measured side by side:
# BENCHMARKS.md, "The gate on a traffic profile").
FAST_TINY = [
    "train.epochs=2",
    "gate.prompts_per_set=4",
    "gate.warmup_requests=1",
    "gate.max_new_tokens=32",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=str(REPO),
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    env.update(extra)
    return env


@dataclass
class PrefectServer:
    url: str  # http://127.0.0.1:P
    env: dict[str, str]  # for every child process that talks to this server
    home: Path
    # the server process (replaced by ``start`` after a kill)
    proc: subprocess.Popen[bytes] | None = None
    server_env: dict[str, str] | None = None  # what ``infra/prefect-server.sh`` was started with

    def kill9(self) -> None:
        """``kill -9`` the server, as a crash or an OOM kill would (its database is left as it
        is)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def start(self) -> None:
        """Start ``infra/prefect-server.sh`` on this server's port and state; returns once
        ``/api/health`` answers."""
        assert self.server_env is not None
        script = ["bash", str(REPO / "infra" / "prefect-server.sh")]
        self.proc = _start(script, self.server_env, self.home / "server.log")
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"{self.api}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                stop(self.proc)
                pytest.fail(
                    f"prefect server did not start:\n{(self.home / 'server.log').read_text()[-3000:]}"
                )
            time.sleep(0.5)

    @property
    def api(self) -> str:
        return f"{self.url}/api"

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.api}{path}", timeout=30)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        response = httpx.post(f"{self.api}{path}", json=body or {}, timeout=30)
        response.raise_for_status()
        return response.json()

    def wait_for_run(self, run_id: str, *, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.get(f"/flow_runs/{run_id}")
            if run["state_type"] in TERMINAL:
                return run
            time.sleep(2)
        raise AssertionError(
            f"flow run {run_id} not finished after {timeout_s:.0f}s: {run['state_type']}"
        )

    def child_runs(self, parent_id: str) -> list[dict[str, Any]]:
        task_runs = self.post("/task_runs/filter", {"flow_runs": {"id": {"any_": [parent_id]}}})
        ids = [t["id"] for t in task_runs]
        if not ids:
            return []
        return self.post("/flow_runs/filter", {"flow_runs": {"parent_task_run_id": {"any_": ids}}})

    def task_runs(self, flow_run_id: str) -> list[dict[str, Any]]:
        return self.post("/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(
            args, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )


def stop(proc: subprocess.Popen[bytes], *, timeout_s: float = 20) -> None:
    """SIGTERM the process group (workers spawn flow-run subprocesses), SIGKILL what is left."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def launch_prefect_server(home: Path, port: int, **extra: str) -> PrefectServer:
    """``infra/prefect-server.sh`` (API + UI) on loopback with state in ``home``, once its health
    endpoint answers; ``extra`` is its environment (``EAGLE3_PREFECT_DB`` ...)."""
    url = f"http://127.0.0.1:{port}"
    env = base_env(
        PREFECT_HOME=str(home), PREFECT_API_URL=f"{url}/api", PREFECT_UI_API_URL=f"{url}/api"
    )
    server_env = env | {
        "EAGLE3_PREFECT_HOST": "127.0.0.1",
        "EAGLE3_PREFECT_PORT": str(port),
        "EAGLE3_PREFECT_PUBLIC_URL": url,
        **extra,
    }
    server = PrefectServer(url, env, home, server_env=server_env)
    server.start()
    return server


@pytest.fixture(scope="module")
def process_worker(prefect_server: PrefectServer) -> Iterator[subprocess.Popen[bytes]]:
    """``infra/prefect-worker.sh`` on the ``e2e`` pool (polls every 2 s), running each flow run in a
    subprocess.

    The script sets the 60 s flow-run heartbeat the zombie automation (created by ``deploy.py
    apply``) expects: a bare ``prefect worker start`` heartbeats every 180 s (Prefect 3.9's
    default), so any run longer than the automation's 180 s window was marked Crashed mid-way."""
    env = prefect_server.env | {
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
    }
    proc = _start(
        ["bash", str(REPO / "infra" / "prefect-worker.sh"), "e2e"],
        env,
        prefect_server.home / "worker.log",
    )
    yield proc
    stop(proc)


def screenshot(url: str, out: Path) -> Path:
    """Headless Chromium screenshot of a UI page (the settings MACHINE.md found to work offline)."""
    subprocess.run(
        [*_chromium_args(), f"--screenshot={out}", url],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def dump_dom(url: str) -> str:
    done = subprocess.run(
        [*_chromium_args(), "--dump-dom", url], check=True, capture_output=True, timeout=120
    )
    return done.stdout.decode(errors="replace")


def _chromium_args() -> list[str]:
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: install it (infra/dev.sh test does: apt-get install chromium)"
        )
    return [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tempfile.mkdtemp(prefix='chromium-')}",
        "--virtual-time-budget=15000",
        "--window-size=1400,900",
    ]


class Browser:
    """Headless Chromium driven over the DevTools protocol: open a page, wait for text or images,
    read the page's text and its images' natural sizes (0 when the browser could not load one), take
    screenshots."""

    def __init__(self) -> None:
        from websockets.sync.client import connect

        port = free_port()
        args = [arg for arg in _chromium_args() if not arg.startswith("--virtual-time-budget")]
        self.proc = subprocess.Popen(
            [*args, f"--remote-debugging-port={port}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline, pages = time.monotonic() + 60, []
        while not pages and time.monotonic() < deadline:
            try:
                pages = [
                    t
                    for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                    if t["type"] == "page"
                ]
            except httpx.HTTPError:
                time.sleep(0.5)
        assert pages, "Chromium's DevTools endpoint did not come up"
        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=64 * 2**20, open_timeout=30)
        self._id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        import json

        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=120))
            if message.get("id") == self._id:
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)[
            "result"
        ].get("value")

    def open(self, url: str, *, until: str = "true", timeout_s: float = 60) -> str:
        """Navigate, wait until the JavaScript condition ``until`` holds (or ``timeout_s``), return
        the page text."""
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.evaluate(
            f"document.readyState === 'complete' && ({until})"
        ):
            time.sleep(1)
        return self.evaluate("document.body.innerText") or ""

    def click_tab(self, label: str, *, until: str = "true", timeout_s: float = 60) -> str:
        """Click the UI tab named ``label``, wait until ``until`` holds, return the page text."""
        self.evaluate(
            "Array.from(document.querySelectorAll('.p-tab')).find(e => e.textContent.trim() === "
            f"{label!r}).click()"
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.evaluate(until):
            time.sleep(1)
        return self.evaluate("document.body.innerText") or ""

    def images(self) -> list[dict[str, Any]]:
        return (
            self.evaluate(
                "Array.from(document.images).map(i => ({src: i.src.slice(0, 40), "
                "width: i.naturalWidth, height: i.naturalHeight}))"
            )
            or []
        )

    def screenshot(self, out: Path) -> Path:
        import base64

        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=1400,
            height=1600,
            deviceScaleFactor=1,
            mobile=False,
        )
        out.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        return out

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(20)


class WebhookReceiver:
    """A loopback HTTP server that records the JSON bodies POSTed to it (the alert automation's
    target)."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        received: list[dict[str, Any]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                received.append(json.loads(body or b"{}"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self.received = received
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


MARKER = "EAGLE3_TEST_MARKER"  # set in a command's environment: every process it starts inherits it


def sigint_as_on_a_terminal() -> None:
    """``preexec_fn`` of a command the test stops with SIGINT: the default SIGINT action, even when
    the tests run in the background (a script's ``cmd &`` starts them with SIGINT ignored, which
    children inherit)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


REFERENCE_SERVER = "-m eagle3.serve.reference"  # in the reference server's command line


def descendant(proc: subprocess.Popen[bytes], words: str) -> Any:
    """The live ``psutil.Process`` of a descendant of ``proc`` whose command line contains
    ``words`` (e.g. ``REFERENCE_SERVER``), or None."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.is_running() and words in " ".join(child.cmdline()):
                    return child
    return None


def run_in_slices(server: Any, enough: Callable[[], bool], *, timeout_s: float) -> None:
    """Let ``server`` (a process group leader, held with SIGSTOP) run 0.1 s at a time until
    ``enough()``, and leave it held. The tiny target answers a regen shard in about 0.2 s, faster
    than a test polls: a test that must act between two answers holds the server from its start
    and steps it."""
    deadline = time.monotonic() + timeout_s
    os.killpg(server.pid, signal.SIGSTOP)
    while not enough():
        assert time.monotonic() < deadline, f"not there after {timeout_s:.0f} s of slices"
        os.killpg(server.pid, signal.SIGCONT)
        time.sleep(0.1)
        os.killpg(server.pid, signal.SIGSTOP)
        time.sleep(0.1)  # the client takes in what the slice answered


def resume(server: Any) -> None:
    """SIGCONT a held server's process group, if it is still there."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGCONT)


def marked_processes(marker: str) -> list[Any]:
    """Every live process whose environment carries ``MARKER=marker``: a command's descendants,
    those that were re-parented or left its process group too."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER) == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:  # exited meanwhile
            continue
    return found


def eagle3(
    args: list[str], env: dict[str, str], *, timeout_s: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run the ``eagle3`` CLI to completion (output captured for assertions)."""
    return subprocess.run(
        [str(BIN / "eagle3"), *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
