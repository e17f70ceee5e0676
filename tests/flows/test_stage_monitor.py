"""What a person watching a stage sees while it runs: the live unit table shows a failed unit with its reason while
the other units still run, the top-level run carries the status (percent, ETA, failed units, re-trigger commands)
and the stage's progress artifact reaches 100% of what this run planned."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from eagle3.config import PipelineConfig
from eagle3.stage import Plan, Progress, Stage, StageResult, Unit, UnitReport

SEEN: dict[str, Any] = {}


def _latest(key: str) -> Any:
    with get_client(sync_client=True) as client:
        found = client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return found[0] if found else None


class Sharded(Stage[Plan]):
    """Three shards of 10 samples, one at a time; shard 1 fails; shard 2 looks at the live table while it runs."""

    name = "sharded"
    unit_name = "shard"
    retries = 0
    scale_out = True
    done: ClassVar[set[Unit]] = set()

    def plan(self, config: PipelineConfig, **inputs: Any) -> Plan:
        return Plan(stage=self.name, fingerprint="fp1", out_dir=Path(config.root), units=(0, 1, 2))

    def max_in_flight(self, config: PipelineConfig) -> int:
        return 1

    def run_unit(self, config: PipelineConfig, plan: Plan, unit: Unit, *, env: Any = None,
                 on_progress: Any = None) -> UnitReport:  # fmt: skip
        if unit == 1:
            raise RuntimeError("server http://127.0.0.1:9 is gone (connection refused)")
        if unit == 2:
            SEEN["live"] = json.loads(_latest("sharded-shards-live-fp1").data)
            SEEN["status"] = _latest("monitored-night-status").data
        self.done.add(unit)
        return UnitReport(unit=unit, rows=10)

    def progress(self, plan: Plan) -> Progress:
        return Progress(done=10 * len(self.done), total=10 * len(plan.units))

    def finalize(self, config: PipelineConfig, plan: Plan, reports: Sequence[UnitReport],
                 failed: Sequence[Unit]) -> StageResult:  # fmt: skip
        return StageResult(stage=self.name, fingerprint=plan.fingerprint, out_dir=plan.out_dir, done=not failed,
                           failed=tuple(failed), retrigger=self.retrigger(plan, failed))


class Single(Sharded):
    """One unit and no file-based progress: finished units count, and the end is 100%."""

    name = "single"
    scale_out = False

    def plan(self, config: PipelineConfig, **inputs: Any) -> Plan:
        return Plan(stage=self.name, fingerprint="fp2", out_dir=Path(config.root))

    def progress(self, plan: Plan) -> None:
        return None


@flow(name="stage-child")
def _child(config: PipelineConfig, stage_name: str) -> bool:
    from flows.stage import run_stage

    return run_stage(Sharded() if stage_name == "sharded" else Single(), config).done


@flow(name="monitored-night")
def _night(config: PipelineConfig) -> bool:
    return _child(config, "single") and _child(config, "sharded")


def test_a_failed_shard_shows_with_its_reason_and_commands_while_the_others_run(prefect_harness, tiny_config):
    state = _night(tiny_config, return_state=True)
    assert state.is_failed()  # the sharded stage fails (after finalizing) on shard 1
    live = {row["shard"]: row for row in SEEN["live"]}
    assert live[1]["state"] == "failed" and "connection refused" in live[1]["reason"]
    assert live[0]["state"] == "done" and live[2]["state"] == "running"
    status = SEEN["status"]
    assert status.startswith("# sharded running: 33.3% - ETA") and "Failed shards so far: 1** [1]" in status
    assert "connection refused" in status and "eagle3 sharded" in status  # the stage's re-trigger command
    final = _latest("monitored-night-status")
    assert final.flow_run_id == state.state_details.flow_run_id, "the status sits on the top-level run"
    assert final.data.startswith("# sharded failed: 66.7%")
    assert _latest("single-progress-fp2").data == 100.0
    assert _latest("sharded-progress-fp1").data == 100 * 2 / 3
