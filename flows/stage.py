"""The one wiring of a stage flow: plan -> units (bounded, placed, followed) -> finalize.

Every stage flow (``flows/<stage>.py``) is a named ``@flow`` whose body calls :func:`run_stage`.
Units are submitted at most ``stage.max_in_flight(config)`` at a time, inside ``stage.resources``
(regen's servers): a scale-out stage's (regen, capture) on the config's task runner with its Ray
placement (``flows.runners.shard_runner``), any other's on the flow's own runner. While they run,
``tasks.monitor.Watch`` publishes the stage's progress (the stage run's progress artifact and live
unit table, the top-level run's status, a periodic log line) from ``stage.progress(plan)``, which
reads the stage's files: the same numbers whatever process or Ray worker runs a unit, and only this
run's work counts toward the rate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prefect.futures import PrefectFuture, as_completed

from eagle3.config.pipeline import PipelineConfig
from eagle3.runtime.stop import raise_pending_stop, stop_on_signals
from eagle3.stage import (
    Plan,
    Stage,
    StageResult,
    Unit,
    UnitFailure,
    UnitReport,
    import_for_units,
    recorded_result,
    result_path,
    unit_failure,
)
from flows.runners import shard_runner
from tasks.monitor import Watch
from tasks.stage import existing_limits, run_logger, stage_tasks

# how often the flow looks at unfinished units (and, every progress_every_s, the progress)
POLL_S = 1.0


def run_stage(stage: Stage[Any], config: PipelineConfig, **inputs: Any) -> StageResult:
    """Plan, run every unit (a failed one never stops the others), finalize; raises ``UnitsFailed``
    after finalizing when units failed. A plan an earlier run finished (``recorded_result``: decided
    from the plan and the files alone) ends here with that run's result: no resources, unit or
    finalize task, no file written; so does a plan with nothing to run (``Stage.idle``)."""
    plan_task, unit_task, finalize_task = stage_tasks(stage)
    plan: Plan = plan_task(stage, config, inputs)
    idle = stage.idle(plan)
    if idle is not None:
        run_logger().info("%s %s: nothing to run", stage.name, plan.fingerprint)
        return idle
    recorded = recorded_result(stage, plan)
    if recorded is not None:
        run_logger().info(
            "%s %s: done in an earlier run (%s); nothing to do",
            stage.name,
            plan.fingerprint,
            result_path(plan).name,
        )
        return recorded
    limits = existing_limits(stage.concurrency_limits(config))
    # here, not in units that start together: lazy imports race (eagle3.stage)
    import_for_units(stage, config)
    # SIGINT or SIGTERM stops the units and the stage's children at once; Prefect's handler (the
    # flow run Crashed) follows where _run_units polls them (eagle3.runtime.stop)
    with (
        stop_on_signals(deferred=True),
        stage.resources(config, plan) as env,
        _submitter(stage, config, unit_task) as submit,
    ):
        watch = Watch(stage, plan, config, env)
        reports, failed, causes = _run_units(
            lambda unit: submit(
                {
                    "stage": stage,
                    "config": config,
                    "plan": plan,
                    "unit": unit,
                    "env": env,
                    "limits": limits,
                }
            ),
            list(plan.units),
            in_flight=stage.max_in_flight(config),
            watch=watch,
        )
        watch.finish()
    return finalize_task(stage, config, plan, reports, failed, causes)


@contextmanager
def _submitter(
    stage: Stage[Any], config: PipelineConfig, unit_task: Any
) -> Iterator[Callable[..., Any]]:
    """Submit unit tasks on the config's task runner (threads or Ray, with the stage's placement)
    for scale-out stages, on the flow's own runner otherwise; units are waited for inside the
    block."""
    if not stage.scale_out:
        yield lambda parameters: unit_task.submit(**parameters)
        return
    with shard_runner(config, stage.name) as runner:  # type: ignore[arg-type]
        yield lambda parameters: runner.submit(unit_task, parameters)


def _run_units(
    submit: Callable[[Unit], PrefectFuture[UnitReport]],
    units: list[Unit],
    *,
    in_flight: int | None,
    watch: Watch,
) -> tuple[list[UnitReport], list[Unit], dict[str, UnitFailure]]:
    """Submit units (at most ``in_flight`` running), wait for all; (reports of completed units,
    failed units, their errors by ``str(unit)``)."""
    running: dict[PrefectFuture[UnitReport], Unit] = {}
    reports: list[UnitReport] = []
    failed: list[Unit] = []
    causes: dict[str, UnitFailure] = {}
    while units or running:
        while units and (in_flight is None or len(running) < in_flight):
            unit = units.pop(0)
            # before the submit: the table must say "running" by the time the unit can look
            watch.started(unit)
            running[submit(unit)] = unit
        try:
            future = next(iter(as_completed(list(running), timeout=POLL_S)))
        except TimeoutError:
            raise_pending_stop()
            watch.poll()
            continue
        raise_pending_stop()
        unit = running.pop(future)
        # a failed unit's exception, logged by its task run
        value = future.result(raise_on_failure=False)
        if future.state.is_completed():
            reports.append(value)
            watch.finished(unit, None)
        else:
            failed.append(unit)
            if isinstance(value, BaseException):
                causes[str(unit)] = unit_failure(value)
            watch.finished(
                unit,
                value if isinstance(value, BaseException) else RuntimeError(future.state.message),
            )
    return reports, failed, causes
