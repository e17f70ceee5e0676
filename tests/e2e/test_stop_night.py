"""`eagle3 run` stopped as people stop it: Ctrl-C (SIGINT) or SIGTERM to its whole process group, at
regen, capture, train and the gate in turn, and its temporary Prefect API server killed once; then
the same command to the end.

The module is one story on one run root (tests run in file order and share it), compared with one
uninterrupted night of the same config on a second root (``reference``). Each stop is checked for
what the README's "Operations" section promises: the exit code (130 for SIGINT, 143 for SIGTERM, 1
for a lost API server) within ``EXIT_WITHIN_S``, no process the run started left alive (every
process carrying the run's marker in its environment, whoever its parent is now), the flow runs
recorded Crashed in Prefect's database, no promotion, and the stage left unfinished. The last run
ends with the reference night's stages, samples and draft, bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import pytest
from e2e_support import (
    BIN,
    FAST_TINY,
    MARKER,
    REFERENCE_SERVER,
    REPO,
    base_env,
    descendant,
    marked_processes,
    resume,
    run_in_slices,
    sigint_as_on_a_terminal,
)
from safetensors.torch import load_file

from flows.commands.common import EXIT_WITHIN_S

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

SHARD_SIZE = 10  # two regen shards of 10 prompts: a short night
SCALE = 20
RUN_TIMEOUT_S = 900
CRASHED = {signal.SIGINT: "an interrupt signal", signal.SIGTERM: "a termination signal"}

Proc = subprocess.Popen[bytes]
Ready = Callable[[Proc], bool]  # the stage to stop is running (given the night's process)


@dataclass
class Night:
    root: Path
    args: list[str]
    env: dict[str, str]
    log: Path

    def run(self, *, marker: str = "") -> Proc:
        """The command in a process group (and session) of its own, as a terminal or a scheduler
        runs it."""
        env = self.env | {MARKER: marker or uuid.uuid4().hex}
        detached = {"start_new_session": True, "preexec_fn": sigint_as_on_a_terminal}
        with open(self.log, "ab") as log:
            return subprocess.Popen(
                self.args, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, **detached
            )

    def finish(self) -> int:
        code = self.run().wait(RUN_TIMEOUT_S)
        assert code in (0, 1, 3), self.log.read_text()[-4000:]  # 1: the gate refused the tiny draft
        return code

    def crashed(self) -> list[str]:
        """The state messages of the flow runs that this night's Prefect database (what its UI
        shows) has as Crashed or Cancelled."""
        databases = list(Path(self.env["PREFECT_HOME"]).glob("*.db"))
        if not databases:
            return []
        query = (
            "SELECT state.message FROM flow_run JOIN flow_run_state AS state "
            "ON flow_run.state_id = state.id "
            "WHERE flow_run.state_type IN ('CRASHED', 'CANCELLED')"
        )
        with sqlite3.connect(databases[0]) as conn:
            return [message for (message,) in conn.execute(query)]


def _night(tmp_path_factory: pytest.TempPathFactory, name: str) -> Night:
    root = tmp_path_factory.mktemp(name)
    args = [str(BIN / "eagle3"), "run", "--recipe", "tiny", "--scale", str(SCALE)]
    for override in [f"root={root}", f"normalize.shard_size={SHARD_SIZE}", *FAST_TINY]:
        args += ["--set", override]
    env = base_env(PREFECT_HOME=str(tmp_path_factory.mktemp(f"{name}-prefect")))
    return Night(root, args, env, root.parent / f"{root.name}.log")


@pytest.fixture(scope="module")
def reference(tiny_world: Any, tmp_path_factory: pytest.TempPathFactory) -> Night:
    night = _night(tmp_path_factory, "uninterrupted")
    night.finish()
    return night


@pytest.fixture(scope="module")
def story(tiny_world: Any, tmp_path_factory: pytest.TempPathFactory) -> Night:
    return _night(tmp_path_factory, "stopped")


def _regen_rows(root: Path) -> int:
    """Rows regen has answered so far: its journals' lines plus its compacted shards' rows (a shard's
    journal goes when it is compacted, so journals alone can fall; the sum never does, and a fast
    engine can finish a shard between two polls)."""
    journals = root.glob("regen/*/shard-*.journal.jsonl")
    rows = sum(len(p.read_text().splitlines()) for p in journals if p.is_file())
    for shard in root.glob("regen/*/shard-*.parquet"):
        with contextlib.suppress(OSError, ValueError):  # replaced or not yet whole
            rows += pq.read_metadata(shard).num_rows
    return rows


def _capturing(root: Path) -> Ready:
    """A capture unit has started (its feature directory exists) and the stage is not done."""
    return lambda _: any(root.glob("features/*/")) and not any(root.glob("features/*/manifest.*"))


def _training(proc: Proc) -> bool:
    """The trainer (``python -m eagle3.train``) is running."""
    return descendant(proc, "-m eagle3.train") is not None


def _gating(log: Path) -> Ready:
    """Both arms of the gate are up (the candidate's server says healthy in this run's log)."""
    start = log.stat().st_size if log.exists() else 0

    def up(_proc: Proc) -> bool:
        with open(log, "rb") as fh:
            fh.seek(start)
            return b"eagle3 server (reference) healthy" in fh.read()

    return up


def _registry(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (root / "registry").glob("*") if p.is_file()}


def _stop_when(story: Night, ready: Ready, stop: Callable[[Proc], None], *, expect: int) -> str:
    """Start the night, ``stop`` it once ``ready(proc)``, and check the stop: the exit code
    ``expect`` within ``EXIT_WITHIN_S``, no process of the run left, no promotion written. Returns
    the run's log."""
    marker, start = uuid.uuid4().hex, story.log.stat().st_size if story.log.exists() else 0
    proc = story.run(marker=marker)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not ready(proc):
        assert proc.poll() is None, f"ended before the stop:\n{story.log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "the stage to stop never started"
        time.sleep(0.2)
    registry = _registry(story.root)
    stop(proc)
    code = proc.wait(EXIT_WITHIN_S + 15)  # the promised bound, and slack for a loaded machine
    left = marked_processes(marker)
    for p in left:
        p.kill()
    log = story.log.read_bytes()[start:].decode(errors="replace")
    assert code == expect, log[-3000:]
    assert not left, f"left running after the stop: {[' '.join(p.cmdline()) for p in left]}"
    assert _registry(story.root) == registry, "a promotion was written after the stop"
    assert "the same command resumes: eagle3 run --recipe tiny" in log.splitlines()[-1]
    return log


def _signalled(
    story: Night, ready: Ready, sig: signal.Signals, *, stop: Callable[[Proc], None] | None = None
) -> str:
    """``_stop_when`` with ``sig`` to the run's process group (sent by ``stop`` when given); the
    night's run and its stage's subflow are recorded Crashed, with the signal as the reason."""
    before = len(story.crashed())
    stop = stop or (lambda proc: os.killpg(proc.pid, sig))
    log = _stop_when(story, ready, stop, expect=128 + sig)
    crashed = story.crashed()[before:]
    assert len(crashed) >= 2, crashed
    assert set(crashed) == {f"Execution was aborted by {CRASHED[sig]}."}, crashed
    assert f"stopped by {sig.name}" in log
    return log


def _ctrl_c_mid_shard(root: Path, log: Path) -> Callable[[Proc], None]:
    """SIGINT to the night while a regen shard, three answers in, waits on its server: the server is
    held from its start and stepped until three answers are journaled (``run_in_slices``); held,
    every shard that started waits on it, so the signal surely lands mid-shard, as it does in a real
    night's hours-long shards. The server resumes once the night says it stops, so it takes the
    night's SIGTERM."""

    def stop(proc: Proc) -> None:
        server = descendant(proc, REFERENCE_SERVER)
        try:
            run_in_slices(server, lambda: _regen_rows(root) >= 3, timeout_s=RUN_TIMEOUT_S)
            rows, deadline = -1, time.monotonic() + 60
            while True:  # settled: no answer arrives any more, and a shard waits for some
                now = _regen_rows(root)
                assert now < 2 * SHARD_SIZE, "regen finished within one slice of its server"
                if now == rows and any(root.glob("regen/*/*.inflight.json")):
                    break
                assert time.monotonic() < deadline, "no regen shard waits on the held server"
                rows = now
                time.sleep(1.0)
            start = log.stat().st_size
            os.killpg(proc.pid, signal.SIGINT)
            while proc.poll() is None and b"stopping the run" not in log.read_bytes()[start:]:
                time.sleep(0.1)
        finally:
            resume(server)

    return stop


def test_ctrl_c_during_regen_stops_the_night_and_its_server(story: Night):
    stop = _ctrl_c_mid_shard(story.root, story.log)
    log = _signalled(
        story, lambda proc: descendant(proc, REFERENCE_SERVER) is not None, signal.SIGINT, stop=stop
    )
    assert "ShardStopped" in log and not any(story.root.glob("regen/*/manifest.json"))


def test_losing_the_temporary_prefect_server_ends_the_night_in_one_line(story: Night):
    def kill_the_api_server(proc: Proc) -> None:
        children = psutil.Process(proc.pid).children()
        (server,) = [p for p in children if "prefect.server.api" in " ".join(p.cmdline())]
        server.kill()  # as an out-of-memory kill does

    rows = _regen_rows(story.root)
    log = _stop_when(
        story, lambda _: _regen_rows(story.root) >= rows + 3, kill_the_api_server, expect=1
    )
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "temporary API server" in errors[0] and "SIGKILL" in errors[0]


def test_sigterm_during_capture_stops_the_night(story: Night):
    _signalled(story, _capturing(story.root), signal.SIGTERM)
    assert not any(story.root.glob("features/*/manifest.json"))


def test_ctrl_c_during_training_stops_the_night_and_its_trainer(story: Night):
    log = _signalled(story, _training, signal.SIGINT)
    assert "training stopped by SIGINT" in log
    assert not any(story.root.glob("drafts/*/export/config.json"))


def test_sigterm_during_the_gate_stops_both_arms_and_promotes_nothing(story: Night):
    _signalled(story, _gating(story.log), signal.SIGTERM)
    assert not any(story.root.glob("gate/*/manifest.json"))
    assert not (story.root / "registry").exists()


def _regen_samples(root: Path) -> dict[str, list[int]]:
    shards = sorted(root.glob("regen/*/shard-*.parquet"))
    columns = ["sample_id", "input_ids"]
    rows = [row for p in shards for row in pq.read_table(p, columns=columns).to_pylist()]
    counts = Counter(row["sample_id"] for row in rows)
    assert counts and max(counts.values()) == 1, "a sample appears twice"
    return {row["sample_id"]: row["input_ids"] for row in rows}


def _finished_stages(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.glob("*/*") if (p / "manifest.json").exists()}


def test_the_stopped_night_resumes_to_the_uninterrupted_nights_result(story, reference):
    story.finish()
    # the same fingerprints, every stage done, the same samples and the same draft weights
    assert _finished_stages(story.root) == _finished_stages(reference.root)
    assert _regen_samples(story.root) == _regen_samples(reference.root)
    drafts = [next(n.root.glob("drafts/*/export/model.safetensors")) for n in (story, reference)]
    mine, expected = (load_file(path) for path in drafts)
    assert mine.keys() == expected.keys() and all(mine[k].equal(expected[k]) for k in mine)
    assert json.loads(next(story.root.glob("gate/*/report.json")).read_text())["verdict"]
