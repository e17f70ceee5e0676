"""The failure policy through Prefect: a data error fails its unit at once (no retry, one attempt),
the other units run, and the stage's one error line ends with that unit's message (file and fix)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from prefect import flow
from prefect.states import Failed

from eagle3.errors import DataError
from eagle3.regen.stop import ShardStopped
from eagle3.runtime.stop import request_stop, stop_on_signals
from eagle3.stage import Plan, Stage, StageResult, Unit, UnitReport, UnitsFailed
from tasks.stage import retry_unless_data_error_or_stopped

ATTEMPTS: Counter[Unit] = Counter()


class DamagedInputStage(Stage[Plan]):
    """Unit 0 meets damaged data; unit 1 works."""

    name = "toy"
    retries = 2  # what the train stage sets: infrastructure failures resume
    inputs: ClassVar[dict[str, str]] = {}

    def plan(self, config: Any, *, out_dir: Path) -> Plan:
        return Plan(stage=self.name, fingerprint="fp", out_dir=out_dir, units=(0, 1))

    def run_unit(
        self, config: Any, plan: Plan, unit: Unit, *, env: Any = None, on_progress: Any = None
    ) -> UnitReport:
        ATTEMPTS[unit] += 1
        if unit == 0:
            raise DataError(
                "/data/shard-00000.parquet: sha256 differs from the manifest. Fix: rebuild it"
            )
        return UnitReport(unit=unit, rows=1)

    def finalize(
        self, config: Any, plan: Plan, reports: Sequence[UnitReport], failed: Sequence[Unit]
    ) -> StageResult:
        return (
            self.failed_result(plan, failed)
            if failed
            else StageResult(stage=self.name, fingerprint="fp", out_dir=plan.out_dir, done=True)
        )


def test_data_error_is_not_retried_and_ends_the_stage_failure_line(
    tiny_config, prefect_harness, tmp_path
):
    from flows.stage import run_stage

    @flow(name="toy-stage")
    def toy_flow() -> StageResult:
        return run_stage(DamagedInputStage(), tiny_config, out_dir=tmp_path)

    ATTEMPTS.clear()
    with pytest.raises(UnitsFailed) as failure:
        toy_flow()
    assert ATTEMPTS == {0: 1, 1: 1}
    assert str(failure.value).endswith(
        "toy 0: /data/shard-00000.parquet: sha256 differs from the manifest. Fix: rebuild it"
    )


def test_a_unit_on_damaged_input_fails_the_stage_as_a_data_error_whose_fix_comes_before_the_re_run(
    tiny_config, tmp_path
):
    """Unit 0 read damaged input, unit 1 ran fine: the stage's error is a data error (exit 2), and
    it does not offer the plain re-run first (it would read the same damaged file again) but the
    unit's fix, then the re-run."""
    from eagle3.stage import UnitsDamaged, run_stage
    from flows.commands.common import EXIT_USAGE, exit_code_for

    with pytest.raises(UnitsFailed) as failure:
        run_stage(DamagedInputStage(), tiny_config, out_dir=tmp_path)
    assert isinstance(failure.value, UnitsDamaged) and isinstance(failure.value, DataError)
    assert exit_code_for(failure.value) == EXIT_USAGE
    message = str(failure.value)
    fix_first = "Units [0] read damaged input: rebuild it as said below, then re-run only the failed units: eagle3 toy"
    assert "Re-run only those" not in message and fix_first in message
    assert message.endswith(
        "toy 0: /data/shard-00000.parquet: sha256 differs from the manifest. Fix: rebuild it"
    )


def test_infrastructure_errors_are_retried_but_data_errors_missing_packages_and_stops_are_not():
    assert retry_unless_data_error_or_stopped(
        None, None, Failed(data=ConnectionError("server went away"))
    )
    assert not retry_unless_data_error_or_stopped(None, None, Failed(data=DataError("damaged")))
    assert not retry_unless_data_error_or_stopped(
        None, None, Failed(data=ShardStopped("stopped by SIGTERM"))
    )
    missing = ModuleNotFoundError("No module named 'ray'")
    assert not retry_unless_data_error_or_stopped(None, None, Failed(data=missing))


def test_no_failure_is_retried_once_the_run_is_stopping():
    with stop_on_signals():
        request_stop("SIGINT")
        lost = Failed(data=ConnectionError("the server was stopped with the run"))
        assert not retry_unless_data_error_or_stopped(None, None, lost)
