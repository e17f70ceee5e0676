"""The nightly deployment on a real Prefect server, run by a process worker, checked over REST and in the UI.

One tiny ``data-scaling`` run (module fixture) feeds every assertion; the regen re-trigger reuses its run root.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_support import FAST_TINY, REPO, PrefectServer, dump_dom, screenshot

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STAGE_FLOWS = {"discover", "normalize", "regen", "capture", "vocab", "train", "gate", "scaling"}
RUN_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def deployed(prefect_server: PrefectServer, tiny_world: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``deploy.py apply`` with the tiny recipe on a fresh run root, both pools named ``e2e``; returns the root."""
    root = tmp_path_factory.mktemp("ui-run-root")
    overrides = (f"root={root}", "mix.total=120", "normalize.shard_size=40", *FAST_TINY)  # 3 prompt shards
    sets = [arg for override in overrides for arg in ("--set", override)]
    args = [sys.executable, "deployments/deploy.py", "apply", "--recipe", "tiny", "--paused"]
    args += ["--cpu-pool", "e2e", "--gpu-pool", "e2e", *sets]
    done = subprocess.run(args, env=prefect_server.env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "data-scaling/tiny" in done.stdout and "regen/tiny" in done.stdout and "gate/tiny" in done.stdout
    return root


def _run_deployment(server: PrefectServer, name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    deployment = server.get(f"/deployments/name/{name}")
    run = server.post(f"/deployments/{deployment['id']}/create_flow_run", {"parameters": parameters})
    return server.wait_for_run(run["id"], timeout_s=RUN_TIMEOUT_S)


@pytest.fixture(scope="module")
def night(prefect_server: PrefectServer, deployed: Path, process_worker: Any) -> dict[str, Any]:
    """One nightly run, triggered like the schedule would (the deployment's own parameters)."""
    return _run_deployment(prefect_server, "data-scaling/tiny", {})


def test_nightly_run_ends_with_the_gate_verdict(night: dict[str, Any], deployed: Path):
    state = night["state"]
    if state["type"] == "FAILED":  # the gate may refuse a tiny draft: then the message points at the report
        assert "gate refused" in state["message"], state["message"]
        report = state["message"].rsplit("report ", 1)[1].strip()
        assert Path(report).is_file() and Path(report).is_relative_to(deployed)
    else:
        assert state["type"] == "COMPLETED", state


def test_every_stage_ran_as_a_subflow(prefect_server: PrefectServer, night: dict[str, Any]):
    children = prefect_server.child_runs(night["id"])
    flows = {f["id"]: f["name"] for f in prefect_server.post("/flows/filter", {})}
    names = {flows[c["flow_id"]] for c in children}
    assert names >= STAGE_FLOWS, f"missing subflows: {STAGE_FLOWS - names}"
    assert all(c["state_type"] == "COMPLETED" for c in children if flows[c["flow_id"]] != "gate")


def test_progress_shard_table_and_gate_report_are_artifacts(prefect_server: PrefectServer, night: dict[str, Any]):
    artifacts = prefect_server.post("/artifacts/filter", {})
    by_type: dict[str, list[dict[str, Any]]] = {}
    for artifact in artifacts:
        by_type.setdefault(artifact["type"], []).append(artifact)
    regen_progress = [a for a in by_type.get("progress", []) if (a["key"] or "").startswith("regen")]
    assert regen_progress and all(a["data"] == 100 for a in regen_progress), regen_progress
    assert any((a["key"] or "").startswith("regen") for a in by_type.get("table", [])), "no regen shard table"
    report = prefect_server.get("/artifacts/gate-report/latest")
    assert report["type"] == "markdown" and "speedup" in report["data"].lower()
    curve = prefect_server.get("/artifacts/scaling-curve/latest")
    assert curve["type"] == "table" and len(json.loads(curve["data"])) == 1


def test_flow_run_page_renders_the_run_in_a_browser(prefect_server: PrefectServer, night: dict[str, Any], tmp_path):
    page = f"{prefect_server.url}/runs/flow-run/{night['id']}"
    dom = dump_dom(page)
    assert night["name"] in dom, "the run's name is not in the rendered page"
    assert night["state"]["name"] in dom
    png = screenshot(page, tmp_path / "flow-run.png")
    import matplotlib.image

    pixels = matplotlib.image.imread(png)
    assert pixels.shape[0] >= 800 and pixels.std() > 0.02, "the screenshot is blank"


def test_regen_retrigger_reruns_only_the_requested_shard(
    prefect_server: PrefectServer, night: dict[str, Any], deployed: Path
):
    (regen_dir,) = [d for d in (deployed / "regen").iterdir() if d.is_dir()]
    shards = sorted(regen_dir.glob("shard-*.parquet"))
    assert len(shards) >= 2, "the tiny prompts should make at least two regen shards"
    lost = shards[1]
    kept = {p: p.stat().st_mtime_ns for p in shards if p != lost}
    lost.unlink()  # as if shard 1 had failed
    args = [sys.executable, "-m", "prefect", "deployment", "run", "regen/tiny", "--param", "shard_ids=[1]"]
    done = subprocess.run(args, env=prefect_server.env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    run_id = re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", done.stdout)
    assert run_id, done.stdout
    final = prefect_server.wait_for_run(run_id.group(0), timeout_s=RUN_TIMEOUT_S)
    assert final["state_type"] == "COMPLETED", final["state"]
    assert lost.exists(), "shard 1 was not regenerated"
    assert {p: p.stat().st_mtime_ns for p in kept} == kept, "other shards were rewritten"
