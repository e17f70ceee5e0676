"""The one launcher: a server that dies in start-up raises with its log, a healthy one is stopped
with its children."""

from __future__ import annotations

import os
import sys
import time

import pytest

from eagle3.serve.launch import LaunchError, ServerProcess

# A stand-in server: answers 200 on every GET at the --port the launcher appends, after starting a
# child of its own.
HEALTHY = """
import argparse, http.server, subprocess, sys
parser = argparse.ArgumentParser()
parser.add_argument("--host")
parser.add_argument("--port", type=int)
parser.add_argument("pid_file")
args = parser.parse_args()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(args.pid_file, "w").write(str(child.pid))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
http.server.HTTPServer((args.host, args.port), H).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_server_that_exits_before_healthy_raises_with_its_log(tmp_path):
    code = "import sys; print('boom: bad flag'); sys.exit(3)"
    server = ServerProcess(
        [sys.executable, "-c", code], log_path=tmp_path / "server.log", health_timeout_s=30
    )
    with pytest.raises(LaunchError, match=r"exited with code 3[\s\S]*boom: bad flag"):
        server.start()


def test_port_zero_picks_a_free_port_and_the_server_is_stopped_with_its_process_group_on_exit(
    tmp_path,
):
    pid_file = tmp_path / "child.pid"
    argv = [sys.executable, "-c", HEALTHY, str(pid_file)]
    with ServerProcess(argv, log_path=tmp_path / "s.log", health_timeout_s=30) as server:
        assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}"
        child = int(pid_file.read_text())
        assert _alive(child)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the server's child process outlived the server"
