"""`eagle3 run --recipe tiny_served` as the user runs it: a night from served traffic alone. The
tiny target's request logs (the ``served_traffic`` fixture: the reference server with SGLang's
request logging) are the only source; no server starts for regen, the draft trains on the requests
as they were answered, and the gate measures the load and the held-out prompts the logs record."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from e2e_support import BIN, FAST_TINY, REPO, base_env

from eagle3.data.served import held_out
from eagle3.data.served_log import ServedRequest, iter_log, log_files
from eagle3.recipes import load_recipe

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUN_TIMEOUT_S = 1200


@pytest.fixture(scope="module")
def night(served_traffic: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("served-root")
    args = [str(BIN / "eagle3"), "run", "--recipe", "tiny_served"]
    for override in [f"root={root}", *FAST_TINY]:
        args += ["--set", override]
    env = base_env(PREFECT_HOME=str(tmp_path_factory.mktemp("prefect-home")))
    done = subprocess.run(
        args, env=env, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    # 1: the gate refused the tiny draft; 3: inconclusive
    assert done.returncode in (0, 1, 3), done.stderr[-4000:]
    return {"root": root, "output": done.stdout + done.stderr, "logs": served_traffic.log_dir}


def _rows(root: Path, stage: str, columns: list[str]) -> list[dict[str, Any]]:
    return [
        r
        for p in sorted(root.glob(f"{stage}/*/shard-*.parquet"))
        for r in pq.read_table(p, columns=columns).to_pylist()
    ]


def test_the_night_trains_on_the_served_answers_without_a_regen_server(night):
    root = night["root"]
    (regen,) = root.glob("regen/*/manifest.json")
    stats = json.loads(regen.read_text())["stats"]
    assert (
        stats["served"] > 0
        and stats["served"] == stats["ok"]
        and not list(root.glob("regen/*/*server*.log"))
    )
    features = _rows(root, "features", ["sample_id"])
    assert sorted(r["sample_id"] for r in features) == sorted(
        r["sample_id"] for r in _rows(root, "regen", ["sample_id"])
    )
    assert (
        f"tonight's rows: {stats['served']} served, 0 regenerated, 0 pretokenized"
        in night["output"]
    )


def test_held_out_requests_are_the_gates_prompts_and_never_trained_on(night):
    root = night["root"]
    config = load_recipe("tiny_served", [f"root={root}"])
    requests = [r for r in iter_log(log_files(night["logs"])) if isinstance(r, ServedRequest)]
    held = {r.rid for r in requests if held_out(r.key, config.served.held_out)}
    trained = {json.loads(r["meta"])["served"]["rid"] for r in _rows(root, "regen", ["meta"])}
    assert held and not held & trained
    (report_path,) = root.glob("gate/*/report.json")
    report = json.loads(report_path.read_text())
    assert set(report["prompts"]) == {"served"} and report["prompts"]["served"] > 0
    assert (
        report["thresholds"]["profile"] == "served"
        and "served requests" in report["thresholds"]["profile_note"]
    )
    assert "traffic profile built from" in report_path.with_name("report.md").read_text()
