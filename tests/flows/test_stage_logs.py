"""The library's log lines in a stage run: printed once on the console, and sent once to the Prefect
UI, in the logs of the unit task that logged them, while other units run at the same time."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogWorker

from eagle3.config.pipeline import PipelineConfig
from eagle3.stage import Plan, Stage, StageResult, Unit, UnitReport

UNITS = (0, 1, 2)
library_logger = logging.getLogger("eagle3.toy_logs")  # a library logger: under ``eagle3``


class Talkative(Stage[Plan]):
    """Three units that all run before any of them logs its line (a barrier), so their logging
    overlaps."""

    name = "talkative"
    retries = 0
    together: ClassVar[threading.Barrier]

    def plan(self, config: PipelineConfig, **inputs: Any) -> Plan:
        return Plan(stage=self.name, fingerprint="fp", out_dir=Path(config.root), units=UNITS)

    def run_unit(
        self,
        config: PipelineConfig,
        plan: Plan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: Any = None,
    ) -> UnitReport:
        self.together.wait()
        library_logger.info("unit %s says hello", unit)
        return UnitReport(unit=unit, rows=1)

    def finalize(
        self,
        config: PipelineConfig,
        plan: Plan,
        reports: Sequence[UnitReport],
        failed: Sequence[Unit],
    ) -> StageResult:
        return StageResult(stage=self.name, fingerprint="fp", out_dir=plan.out_dir, done=True)


def test_a_library_line_is_printed_once_and_reaches_its_own_unit_runs_logs_once(
    tiny_config, prefect_harness, tmp_path, caplog: pytest.LogCaptureFixture
):
    from flows.stage import run_stage

    @flow(name="talkative-stage")
    def talkative_flow() -> StageResult:
        return run_stage(Talkative(), tiny_config.model_copy(update={"root": str(tmp_path)}))

    Talkative.together = threading.Barrier(len(UNITS), timeout=120)
    caplog.set_level(logging.INFO)
    state = talkative_flow(return_state=True)
    assert state.is_completed(), state.message
    APILogWorker.drain_all(timeout=30)
    this_run = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id]))
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=this_run)
    for unit in UNITS:
        line = f"unit {unit} says hello"
        printed = [r for r in caplog.records if line in r.getMessage()]
        # the console prints it once
        assert len(printed) == 1, [f"{r.name}: {r.getMessage()}" for r in printed]
        sent = [log for log in logs if line in log.message]
        assert [log.message for log in sent] == [f"eagle3.toy_logs: {line}"]  # the UI has it once
        (reported,) = [log for log in logs if log.message.startswith(f"talkative unit {unit}: ")]
        assert sent[0].task_run_id == reported.task_run_id, "in the logs of the unit that logged it"
