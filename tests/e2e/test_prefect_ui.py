"""The nightly deployment on a real Prefect server, run by a process worker, checked over REST and
in the UI.

One tiny ``data-scaling`` run (module fixture) with ``scaling.policy=aimed`` over a subset of the
prompt pool (``--scale``: 48 of 120 prompts, split across the tiny world's sources by the plan)
feeds every assertion; it is watched while it runs (the nightly page's status mid-regen, in
Chromium), and its page shows tonight's plan table. The regen re-triggers reuse its run root (the
aimed selection's shards, as the night regenerated them): one against a reference server whose every
request fails (a shard fails, the live table shows it with its reason, the alert fires), one that
regenerates the shard. Screenshots go to ``$E2E_SCREENSHOTS`` (default
``/tmp/eagle3-e2e-screenshots``), printed by the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import (
    BIN,
    FAST_TINY,
    REPO,
    TERMINAL,
    Browser,
    PrefectServer,
    WebhookReceiver,
    _start,
    dump_dom,
    free_port,
    screenshot,
    stop,
)

# The first test also pays for the module's fixtures: two applies, the whole night watched mid-run,
# two screenshots.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

STAGE_FLOWS = {"discover", "normalize", "regen", "capture", "vocab", "train", "gate", "scaling"}
RUN_TIMEOUT_S = 900
# tonight's budget in prompts: ~7 of each source's ~11 (120 prompts, less quarantine and eval set)
SCALE = 48
AIMED = ("scaling.policy=aimed", "scaling.eval_per_domain=2", "scaling.eval_max_new_tokens=16")
SCREENSHOTS = Path(os.environ.get("E2E_SCREENSHOTS", "/tmp/eagle3-e2e-screenshots"))
PERCENT_ETA = re.compile(r"\d+\.\d% - ETA (\d+ (h|min|s)|unknown|done)")


@pytest.fixture(scope="module")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    print(f"\nUI screenshots in {SCREENSHOTS}")
    return SCREENSHOTS


@pytest.fixture(scope="module")
def webhook() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def deployed(
    prefect_server: PrefectServer,
    tiny_world: Any,
    tmp_path_factory: pytest.TempPathFactory,
    webhook: WebhookReceiver,
) -> Path:
    """``deploy.py apply`` with the tiny recipe on a fresh run root, ``--scale`` below the pool,
    both pools named ``e2e``, alerts to the loopback webhook; returns the root."""
    root = tmp_path_factory.mktemp("ui-run-root")
    overrides = (
        f"root={root}",
        "mix.total=120",
        "normalize.shard_size=40",
        "orchestration.progress_every_s=5",
        "monitor.log_every_s=20",
        *FAST_TINY,
        *AIMED,
    )  # 3 prompt shards
    sets = [arg for override in overrides for arg in ("--set", override)]
    args = [
        sys.executable,
        "deployments/deploy.py",
        "apply",
        "--recipe",
        "tiny",
        "--paused",
        "--scale",
        str(SCALE),
    ]
    args += ["--cpu-pool", "e2e", "--gpu-pool", "e2e", "--alert-webhook", webhook.url, *sets]
    done = subprocess.run(
        args, env=prefect_server.env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "data-scaling/tiny" in done.stdout
        and "regen/tiny" in done.stdout
        and "gate/tiny" in done.stdout
    )
    assert "automation/eagle3-alert-tiny" in done.stdout, done.stdout
    again = subprocess.run(
        args, env=prefect_server.env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0 and again.stdout == done.stdout, "apply is not idempotent"
    return root


def _run_deployment(server: PrefectServer, name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    deployment = server.get(f"/deployments/name/{name}")
    run = server.post(
        f"/deployments/{deployment['id']}/create_flow_run", {"parameters": parameters}
    )
    return server.wait_for_run(run["id"], timeout_s=RUN_TIMEOUT_S)


def _latest_artifact(server: PrefectServer, key: str) -> dict[str, Any] | None:
    try:
        return server.get(f"/artifacts/{key}/latest")
    except httpx.HTTPStatusError:
        return None


def _watch_mid_regen(server: PrefectServer, run_id: str, out: Path) -> dict[str, Any]:
    """While the night runs: wait for the regen stage's status on the nightly run, then open the
    nightly run's page in Chromium; returns the status artifact and the page's text."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (
        time.monotonic() < deadline
        and server.get(f"/flow_runs/{run_id}")["state_type"] not in TERMINAL
    ):
        status = _latest_artifact(server, "data-scaling-status")
        if status and (status["description"] or "").startswith("regen running"):
            browser = Browser()
            # the page opens on its logs: the status line is there; the status itself under
            # Artifacts
            try:
                logs = browser.open(
                    f"{server.url}/runs/flow-run/{run_id}",
                    until="/regen: .*ETA/.test(document.body.innerText)",
                )
                browser.screenshot(out / "nightly-mid-regen-logs.png")
                text = browser.click_tab(
                    "Artifacts", until="/regen running .*% - ETA/.test(document.body.innerText)"
                )
                browser.screenshot(out / "nightly-mid-regen.png")
            finally:
                browser.close()
            return {"status": status, "page": text, "logs": logs}
        time.sleep(1)
    raise AssertionError("the nightly run never showed a running regen status")


@pytest.fixture(scope="module")
def night(
    prefect_server: PrefectServer, deployed: Path, process_worker: Any, screenshots: Path
) -> dict[str, Any]:
    """One nightly run, triggered like the schedule would (the deployment's own parameters:
    ``--scale``), watched mid-regen; ``mid_run`` holds what the nightly page showed then."""
    deployment = prefect_server.get("/deployments/name/data-scaling/tiny")
    run = prefect_server.post(
        f"/deployments/{deployment['id']}/create_flow_run", {"parameters": {}}
    )
    mid_run = _watch_mid_regen(prefect_server, run["id"], screenshots)
    final = prefect_server.wait_for_run(run["id"], timeout_s=RUN_TIMEOUT_S)
    # beside the screenshots: what the server and worker said
    for log in ("server.log", "worker.log"):
        shutil.copy(prefect_server.home / log, screenshots / log)
    browser = Browser()
    try:
        browser.open(
            f"{prefect_server.url}/runs/flow-run/{run['id']}",
            until="document.querySelector('.p-tab')",
        )
        browser.click_tab(
            "Artifacts", until="/scaling (done|failed)/.test(document.body.innerText)"
        )
        browser.screenshot(screenshots / "nightly-completed.png")
    finally:
        browser.close()
    return final | {"mid_run": mid_run}


def test_nightly_run_ends_with_the_gate_verdict(night: dict[str, Any], deployed: Path):
    state = night["state"]
    # the gate may refuse a tiny draft, or find the box too noisy to tell (Inconclusive):
    if state["type"] == "FAILED":
        # then the message points at the report
        assert state["message"].startswith(("gate refused", "gate inconclusive")), state["message"]
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


def _selected_rows(root: Path) -> int:
    (nights,) = root.glob("selection/*/nights.json")
    (first,) = json.loads(nights.read_text())
    return sum(first["rows"].values())


def test_progress_shard_table_and_gate_report_are_artifacts(
    prefect_server: PrefectServer, night: dict[str, Any], deployed: Path
):
    artifacts = prefect_server.post("/artifacts/filter", {})
    by_type: dict[str, list[dict[str, Any]]] = {}
    for artifact in artifacts:
        by_type.setdefault(artifact["type"], []).append(artifact)
    regen_progress = [
        a for a in by_type.get("progress", []) if (a["key"] or "").startswith("regen")
    ]
    assert regen_progress and all(a["data"] == 100 for a in regen_progress), regen_progress
    # the budget's 48 prompts, and the pre-tokenized rows outside it
    planned = _selected_rows(deployed)
    tonight = f"{planned}/{planned} samples"  # tonight's plan, not the pool's 120
    assert any(tonight in (a["description"] or "") for a in regen_progress), regen_progress
    assert any((a["key"] or "").startswith("regen") for a in by_type.get("table", [])), (
        "no regen shard table"
    )
    report = prefect_server.get("/artifacts/gate-report/latest")
    assert report["type"] == "markdown" and "speedup" in report["data"].lower()
    assert "crossover: " in report["data"] and "## Serving configuration" in report["data"], report[
        "data"
    ][:3000]
    curve = prefect_server.get("/artifacts/scaling-curve/latest")
    assert curve["type"] == "table" and len(json.loads(curve["data"])) == 1


def test_the_nightly_page_shows_tonights_aimed_plan_table(
    prefect_server: PrefectServer, night: dict[str, Any], deployed: Path
):
    (artifact,) = prefect_server.post(
        "/artifacts/filter",
        {"artifacts": {"key": {"any_": ["night-plan"]}}, "sort": "CREATED_DESC", "limit": 1},
    )
    assert artifact["flow_run_id"] == night["id"] and artifact["type"] == "markdown"
    header = "| domain | pool left | current accept | traffic share | allocation | bound by | why |"
    assert header in artifact["data"] and "| sharegpt |" in artifact["data"], artifact["data"]
    browser = Browser()
    try:
        page = browser.open(
            f"{prefect_server.url}/artifacts/artifact/{artifact['id']}",
            until="/traffic share/.test(document.body.innerText)",
        )
        browser.screenshot(SCREENSHOTS / "night-plan.png")
    finally:
        browser.close()
    assert "traffic share" in page and "sharegpt" in page and "nothing measured yet" in page, page[
        -2000:
    ]
    assert header in prefect_server.get("/artifacts/data-scaling-summary/latest")["data"]
    (point,) = [
        json.loads(line) for line in (deployed / "scaling" / "curve.jsonl").read_text().splitlines()
    ]
    assert point["policy"] == "aimed" and point["domains"]["sharegpt"]["accept"] >= 1.0, point


def test_no_eval_prompt_reaches_regen_or_training(night: dict[str, Any], deployed: Path):
    import pyarrow.parquet as pq

    (pool,) = deployed.glob("selection/*/pool.json")
    eval_ids = set(json.loads(pool.read_text())["eval_ids"])
    assert len(eval_ids) >= 12  # 2 per source with prompts to hold out
    for stage in ("selection", "regen", "features"):
        shards = sorted(deployed.glob(f"{stage}/*/shard-*.parquet"))
        ids = {
            sid
            for p in shards
            for sid in pq.read_table(p, columns=["sample_id"])["sample_id"].to_pylist()
        }
        assert shards and ids and not ids & eval_ids, stage


def test_flow_run_page_renders_the_run_in_a_browser(
    prefect_server: PrefectServer, night: dict[str, Any], tmp_path
):
    page = f"{prefect_server.url}/runs/flow-run/{night['id']}"
    dom = dump_dom(page)
    assert night["name"] in dom, "the run's name is not in the rendered page"
    assert night["state"]["name"] in dom
    png = screenshot(page, tmp_path / "flow-run.png")
    import matplotlib.image

    pixels = matplotlib.image.imread(png)
    assert pixels.shape[0] >= 800 and pixels.std() > 0.02, "the screenshot is blank"


def test_the_nightly_page_shows_the_running_stage_percent_and_eta_mid_run(night: dict[str, Any]):
    mid = night["mid_run"]
    assert mid["status"]["flow_run_id"] == night["id"], "the status is on the nightly run itself"
    assert PERCENT_ETA.search(mid["status"]["data"]) and "samples" in mid["status"]["data"], mid[
        "status"
    ]["data"]
    assert PERCENT_ETA.search(mid["page"]), mid["page"][-2000:]
    assert re.search(r"regen: \d+\.\d% - .* - ETA ", mid["logs"]), mid["logs"][-2000:]
    assert (SCREENSHOTS / "nightly-mid-regen.png").stat().st_size > 10_000


def test_the_nights_plots_render_as_images_in_the_browser(
    prefect_server: PrefectServer, night: dict[str, Any]
):
    plots = prefect_server.get("/artifacts/night-plots/latest")
    assert (
        plots["flow_run_id"] == night["id"] and plots["data"].count("data:image/png;base64,") == 4
    )
    # `/artifacts/{key}/latest` answers with the key's *collection* row, whose id is not the
    # artifact's (the UI shows an empty page for it): the artifact's own id comes from the filter
    # endpoint
    (artifact,) = prefect_server.post(
        "/artifacts/filter",
        {"artifacts": {"key": {"any_": ["night-plots"]}}, "sort": "CREATED_DESC", "limit": 1},
    )
    assert artifact["data"] == plots["data"]
    browser = Browser()
    try:
        browser.open(
            f"{prefect_server.url}/artifacts/artifact/{artifact['id']}",
            until="document.images.length >= 4 && Array.from(document.images).every(i => i.complete)",
        )
        images = [i for i in browser.images() if i["src"].startswith("data:image/png")]
        browser.screenshot(SCREENSHOTS / "night-plots.png")
    finally:
        browser.close()
    assert len(images) == 4 and all(i["width"] > 0 and i["height"] > 0 for i in images), images


def test_a_failing_nightly_run_posts_one_alert_with_its_name_state_and_link(
    prefect_server: PrefectServer, night: dict[str, Any], webhook: WebhookReceiver
):
    # fails at plan-night
    failed = _run_deployment(prefect_server, "data-scaling/tiny", {"shard_ids": [99]})
    assert failed["state_type"] == "FAILED"
    mine = _alerts_for(webhook, failed["name"], timeout_s=120)
    time.sleep(10)  # a second notification (a subflow, a duplicate) would arrive by now
    mine = _alerts_for(webhook, failed["name"], timeout_s=0)
    assert len(mine) == 1, mine
    assert "Failed" in mine[0]["text"] and f"/runs/flow-run/{failed['id']}" in mine[0]["text"], (
        mine[0]
    )


def _alerts_for(
    webhook: WebhookReceiver, run_name: str, *, timeout_s: float
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        mine = [body for body in webhook.received if run_name in body.get("text", "")]
        if mine or time.monotonic() >= deadline:
            return mine
        time.sleep(1)


@pytest.fixture
def failing_server(prefect_server: PrefectServer, tiny_world: Any) -> Iterator[str]:
    """A reference server on the tiny model whose every generation request fails (the server's fault
    flag)."""
    port = free_port()
    args = [
        str(BIN / "python"),
        "-m",
        "eagle3.serve.reference",
        "--model",
        str(tiny_world.model_dir),
        "--port",
        str(port),
        "--fault-fail-rate",
        "1.0",
    ]
    proc = _start(args, prefect_server.env, prefect_server.home / "failing-server.log")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    yield url
    stop(proc)


def test_a_failed_shard_is_in_the_live_table_with_its_reason_before_the_stage_ends(
    prefect_server: PrefectServer, night: dict[str, Any], deployed: Path, failing_server: str
):
    (regen_dir,) = [d for d in (deployed / "regen").iterdir() if d.is_dir()]
    # shard 1 to redo, against a server that fails every request
    (regen_dir / "shard-00001.parquet").unlink()
    deployment = prefect_server.get("/deployments/name/regen/tiny")
    config = deployment["parameters"]["config"]
    overrides = [
        *config["overrides"],
        f'regen.servers=["{failing_server}"]',
        "regen.max_retries=0",
        "regen.eject_after_failures=1",
        "regen.readmit_after_s=1",
    ]
    run = _run_deployment(
        prefect_server,
        "regen/tiny",
        {"shard_ids": [1], "config": config | {"overrides": overrides}},
    )
    assert run["state_type"] == "FAILED", run["state"]
    live = prefect_server.get(f"/artifacts/regen-shards-live-{regen_dir.name}/latest")
    rows = {row["shard"]: row for row in json.loads(live["data"])}
    assert rows[1]["state"] == "failed" and "injected fault" in rows[1]["reason"], rows
    updated, ended = (
        datetime.fromisoformat(t.replace("Z", "+00:00")) for t in (live["updated"], run["end_time"])
    )
    assert updated < ended, "the live table showed the failure only after the stage ended"
    status = prefect_server.get("/artifacts/regen-status/latest")["data"]
    assert "prefect deployment run 'regen/tiny' --param shard_ids='[1]'" in status, status
    assert f"eagle3 retry-shards --run {regen_dir} --shard 1" in status, status


def test_regen_retrigger_reruns_only_the_requested_shard(
    prefect_server: PrefectServer, night: dict[str, Any], deployed: Path
):
    (regen_dir,) = [d for d in (deployed / "regen").iterdir() if d.is_dir()]
    shards = sorted(regen_dir.glob("shard-*.parquet"))
    assert shards, "the night regenerated no shard"
    lost = regen_dir / "shard-00001.parquet"
    kept = {p: p.stat().st_mtime_ns for p in shards if p != lost}
    # as if shard 1 had failed (the failing-server test above left it missing)
    lost.unlink(missing_ok=True)
    args = [
        sys.executable,
        "-m",
        "prefect",
        "deployment",
        "run",
        "regen/tiny",
        "--param",
        "shard_ids=[1]",
    ]
    done = subprocess.run(
        args, env=prefect_server.env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run_id = re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", done.stdout)
    assert run_id, done.stdout
    final = prefect_server.wait_for_run(run_id.group(0), timeout_s=RUN_TIMEOUT_S)
    assert final["state_type"] == "COMPLETED", final["state"]
    assert lost.exists(), "shard 1 was not regenerated"
    assert {p: p.stat().st_mtime_ns for p in kept} == kept, "other shards were rewritten"
