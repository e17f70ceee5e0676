"""`eagle3 run --recipe tiny --scale N` as the user runs it: killed during regen and resumed, then a
second night.

The module is one story on one run root (tests run in file order and share it):

1. night 1 is killed (SIGKILL to the whole process group) while regen is writing its journals;
2. the same command again finishes: prompts are not rebuilt, regen rows journaled before the kill
   are kept (their ``server`` is the first run's reference server), every sample appears exactly
   once; its gate report shows each level of the tiny traffic profile, the crossover and the emitted
   SGLang adaptive config;
3. night 2 adds ``scale`` prompts: earlier regen and feature shards are untouched, only new shards
   are written, and the scaling curve has two points;
4. night 2 run again (its shards given explicitly) is a no-op: no process but the command and its
   Prefect API server (no reference server, trainer or gate arm), and not one file of the run root
   written or touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import pytest
from e2e_support import (
    BIN,
    FAST_TINY,
    REFERENCE_SERVER,
    REPO,
    base_env,
    descendant,
    resume,
    run_in_slices,
    stop,
)

from eagle3.regen.journal import TURN_KEY

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SHARD_SIZE = 40  # small prompt shards so that one night is a few shards
SCALE = 80  # two shards a night
RUN_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def story(tiny_world: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("nights-root")
    overrides = [f"root={root}", f"normalize.shard_size={SHARD_SIZE}", *FAST_TINY]
    args = [str(BIN / "eagle3"), "run", "--recipe", "tiny", "--scale", str(SCALE)]
    for override in overrides:
        args += ["--set", override]
    # results cached by this story only
    env = base_env(PREFECT_HOME=str(tmp_path_factory.mktemp("prefect-home")))
    return {"root": root, "args": args, "env": env, "log": root.parent / f"{root.name}.log"}


def _run(story: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        story["args"],
        env=story["env"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    # 1 = the gate refused the tiny draft, 3 = inconclusive
    assert done.returncode in (0, 1, 3), done.stderr[-4000:]
    assert "report" in done.stderr + done.stdout
    return done


def _regen_dir(root: Path) -> Path:
    (regen,) = [d for d in (root / "regen").iterdir() if d.is_dir()]
    return regen


def _journal_rows(root: Path) -> int:
    if not (root / "regen").exists():
        return 0
    return sum(
        len(p.read_text().splitlines()) for p in (root / "regen").glob("*/shard-*.journal.jsonl")
    )


def _rows(paths: list[Path], columns: list[str]) -> list[dict[str, Any]]:
    return [row for p in paths for row in pq.read_table(p, columns=columns).to_pylist()]


def test_killed_during_regen_then_the_same_command_resumes(story: dict[str, Any]):
    root = story["root"]
    with open(story["log"], "wb") as log:
        proc = subprocess.Popen(
            story["args"],
            env=story["env"],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (server := descendant(proc, REFERENCE_SERVER)) is None:
        assert proc.poll() is None, f"run ended before regen:\n{story['log'].read_text()[-3000:]}"
        assert time.monotonic() < deadline, "regen's server never started"
        time.sleep(0.1)
    # held and stepped: a tiny shard is answered faster than a poll, so the kill lands mid-shard
    run_in_slices(server, lambda: _journal_rows(root) >= 5, timeout_s=RUN_TIMEOUT_S)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    resume(server)  # it takes the SIGTERM its parent's death sent it
    stop(proc)
    lines = [
        json.loads(line)
        for p in (root / "regen").glob("*/shard-*.journal.jsonl")
        for line in p.read_text().splitlines()
        if line.strip().endswith("}")
    ]
    # finished samples only
    journaled = {row["sample_id"]: row["server"] for row in lines if TURN_KEY not in row}
    prompts_manifest = next((root / "prompts").glob("*/manifest.json"))
    prompts_written = json.loads(prompts_manifest.read_text())["created_at"]

    _run(story)

    assert json.loads(prompts_manifest.read_text())["created_at"] == prompts_written, (
        "prompts were rebuilt"
    )
    regen = _regen_dir(root)
    rows = _rows(sorted(regen.glob("shard-*.parquet")), ["sample_id", "server"])
    counts = Counter(r["sample_id"] for r in rows)
    assert counts and max(counts.values()) == 1, "a sample appears twice in the regen output"
    kept = [
        sid
        for sid, server in journaled.items()
        if any(r["sample_id"] == sid and r["server"] == server for r in rows)
    ]
    assert len(kept) == len(journaled), "samples finished before the kill were regenerated again"


def test_the_nights_gate_report_shows_each_levels_verdict_the_crossover_and_the_adaptive_config(
    story: dict[str, Any],
):
    (gate_dir,) = [d for d in (story["root"] / "gate").iterdir() if d.is_dir()]
    report = json.loads((gate_dir / "report.json").read_text())
    (decision,) = report["decisions"]
    # the tiny profile
    assert [lv["concurrency"] for lv in decision["levels"]] == [1, 4], decision["reasons"]
    assert all(lv["verdict"] in ("pass", "fail", "inconclusive") for lv in decision["levels"])
    assert decision["crossover"]["summary"] and set(decision["by_set"]) == {"chat", "code", "math"}
    assert [t["batch_size"] for t in report["adaptive"]["tiers"]] == [1, 2]
    markdown = (gate_dir / "report.md").read_text()
    assert (
        "| concurrency | share | rounds | speedup | interval | verdict | vs baseline |" in markdown
    )
    assert (
        "  - crossover: " in markdown
        and "## Serving configuration (SGLang adaptive speculation)" in markdown
    )
    assert report["adaptive"]["launch_sglang"] in markdown


def test_second_night_adds_only_new_shards_and_a_curve_point(story: dict[str, Any]):
    root = story["root"]
    regen = _regen_dir(root)
    night1 = {p.name: p.stat().st_mtime_ns for p in regen.glob("shard-*.parquet")}
    features = {p.name: p.stat().st_mtime_ns for p in root.glob("features/*/shard-*.parquet")}

    _run(story)

    night2 = {p.name: p.stat().st_mtime_ns for p in regen.glob("shard-*.parquet")}
    assert {k: night2[k] for k in night1} == night1, "night 2 rewrote shards regenerated on night 1"
    assert len(night2) > len(night1), "night 2 regenerated nothing new"
    assert {
        p.name: p.stat().st_mtime_ns
        for p in root.glob("features/*/shard-*.parquet")
        if p.name in features
    } == (features), "night 2 recaptured shards captured on night 1"
    points = [
        json.loads(line) for line in (root / "scaling" / "curve.jsonl").read_text().splitlines()
    ]
    assert len(points) == 2 and points[1]["total_prompts"] > points[0]["total_prompts"]
    assert points[1]["train_samples"] > points[0]["train_samples"]
    assert (root / "scaling" / "curve.png").is_file()


def _snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """path -> (mtime_ns, size, sha256) of every file under the run root."""
    return {
        str(p.relative_to(root)): (
            p.stat().st_mtime_ns,
            p.stat().st_size,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _children_while_running(proc: subprocess.Popen[bytes]) -> set[str]:
    """The command lines of every descendant the command started, polled until it exits (not the
    empty line of an exited child, nor the command's own line, which a forked child shows until it
    executes its program)."""
    seen: set[str] = set()
    parent = psutil.Process(proc.pid)
    own = " ".join(parent.cmdline())
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the no-op night did not finish"
        try:
            children = parent.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for child in children:
            try:
                seen.add(" ".join(child.cmdline()))
            except psutil.Error:  # exited between the listing and the look
                continue
        time.sleep(0.1)
    return seen - {"", own}


def test_a_finished_night_run_again_starts_nothing_and_changes_no_file(story: dict[str, Any]):
    root = story["root"]
    shards = sorted(int(p.name[6:11]) for p in _regen_dir(root).glob("shard-*.parquet"))
    before = _snapshot(root)
    args = story["args"] + [arg for k in shards for arg in ("--shard", str(k))]
    with open(story["log"], "ab") as log:
        proc = subprocess.Popen(
            args, env=story["env"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT
        )
        started = _children_while_running(proc)
    # the recorded verdict of the night is replayed: 1 = the gate refused the tiny draft, 3 =
    # inconclusive
    assert proc.wait() in (0, 1, 3), story["log"].read_text()[-4000:]
    # Prefect's vendored croniter calls platform.architecture() at import, which runs `file -b
    # <interpreter>`.
    others = {
        cmd
        for cmd in started
        if "prefect.server.api.server:create_app" not in cmd
        and cmd != f"file -b {os.path.realpath(sys.executable)}"
    }
    assert not others, f"a finished night started processes: {others}"
    after = _snapshot(root)
    changed = {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}
    assert not changed, f"a finished night wrote or touched: {sorted(changed)}"
