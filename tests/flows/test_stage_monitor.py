"""What a person watching a stage sees while it runs: the live unit table shows a failed unit with
its reason while the other units still run, the top-level run carries the status (percent, ETA,
failed units, re-trigger commands) and the stage's progress artifact reaches 100% of what this run
planned; the boards are refreshed per period, not per unit, so a night of many shards costs Prefect
a constant number of writes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from eagle3.config.pipeline import PipelineConfig
from eagle3.stage import Plan, Progress, Stage, StageResult, Unit, UnitReport

SEEN: dict[str, Any] = {}


def _latest(key: str) -> Any:
    with get_client(sync_client=True) as client:
        found = client.read_latest_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    return found[0] if found else None


class Sharded(Stage[Plan]):
    """Three shards of 10 samples, one at a time; shard 1 fails; shard 2 looks at the live table
    while it runs."""

    name = "sharded"
    unit_name = "shard"
    retries = 0
    scale_out = True
    done: ClassVar[set[Unit]] = set()

    def plan(self, config: PipelineConfig, **inputs: Any) -> Plan:
        return Plan(stage=self.name, fingerprint="fp1", out_dir=Path(config.root), units=(0, 1, 2))

    def max_in_flight(self, config: PipelineConfig) -> int:
        return 1

    def run_unit(
        self,
        config: PipelineConfig,
        plan: Plan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: Any = None,
    ) -> UnitReport:
        if unit == 1:
            raise RuntimeError("server http://127.0.0.1:9 is gone (connection refused)")
        if unit == 2:
            SEEN["live"] = json.loads(_latest("sharded-shards-live-fp1").data)
            SEEN["status"] = _latest("monitored-night-status").data
        self.done.add(unit)
        return UnitReport(unit=unit, rows=10)

    def progress(self, plan: Plan) -> Progress:
        return Progress(done=10 * len(self.done), total=10 * len(plan.units))

    def finalize(
        self,
        config: PipelineConfig,
        plan: Plan,
        reports: Sequence[UnitReport],
        failed: Sequence[Unit],
    ) -> StageResult:
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=not failed,
            failed=tuple(failed),
            retrigger=self.retrigger(plan, failed),
        )


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


def _refresh_every(config: PipelineConfig, seconds: float) -> PipelineConfig:
    orchestration = config.orchestration.model_copy(update={"progress_every_s": seconds})
    return config.model_copy(update={"orchestration": orchestration})


def test_a_failed_shard_shows_with_its_reason_and_commands_while_the_others_run(
    prefect_harness, tiny_config
):
    # A refresh is due at every start here (the boards refresh per period): shard 2 then reads
    # itself "running".
    state = _night(_refresh_every(tiny_config, 1e-6), return_state=True)
    assert state.is_failed()  # the sharded stage fails (after finalizing) on shard 1
    live = {row["shard"]: row for row in SEEN["live"]}
    assert live[1]["state"] == "failed" and "connection refused" in live[1]["reason"]
    assert live[0]["state"] == "done" and live[2]["state"] == "running"
    status = SEEN["status"]
    assert (
        status.startswith("# sharded running: 33.3% - ETA")
        and "Failed shards so far: 1** [1]" in status
    )
    # the stage's re-trigger command
    assert "connection refused" in status and "eagle3 sharded" in status
    final = _latest("monitored-night-status")
    assert final.flow_run_id == state.state_details.flow_run_id, (
        "the status sits on the top-level run"
    )
    assert final.data.startswith("# sharded failed: 66.7%")
    assert _latest("single-progress-fp2").data == 100.0
    assert _latest("sharded-progress-fp1").data == 100 * 2 / 3


class Many(Sharded):
    """Twelve units that all succeed, no file-based progress."""

    name = "many"

    def plan(self, config: PipelineConfig, **inputs: Any) -> Plan:
        return Plan(
            stage=self.name, fingerprint="fp3", out_dir=Path(config.root), units=tuple(range(12))
        )

    def run_unit(
        self,
        config: PipelineConfig,
        plan: Plan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: Any = None,
    ) -> UnitReport:
        return UnitReport(unit=unit, rows=1)


@flow(name="many-units")
def _many(config: PipelineConfig) -> bool:
    from flows.stage import run_stage

    return run_stage(Many(), config).done


def test_units_that_succeed_refresh_the_boards_per_period_not_per_unit(
    prefect_harness, tiny_config, monkeypatch
):
    from tasks.monitor import StageMonitor

    publishes: list[str] = []
    publish = StageMonitor.publish
    monkeypatch.setattr(
        StageMonitor,
        "publish",
        lambda self, **kw: publishes.append(kw["state"]) or publish(self, **kw),
    )
    assert _many(_refresh_every(tiny_config, 3600.0))
    assert publishes == ["running", "done"], (
        "one board at the start and one at the end, whatever the unit count"
    )
    assert _latest("many-progress-fp3").data == 100.0
