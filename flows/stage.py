"""The one wiring of a stage flow: plan -> units (bounded, placed, followed) -> finalize.

Every stage flow (``flows/<stage>.py``) is a named ``@flow`` whose body calls :func:`run_stage`. Units are submitted
at most ``stage.max_in_flight(config)`` at a time, inside ``stage.resources`` (regen's servers): a scale-out stage's
(regen, capture) on the config's task runner with its Ray placement (``flows.runners.shard_runner``), any other's
on the flow's own runner. While they run, one progress artifact per stage run
(``<stage>-progress-<fp>``) is refreshed from ``stage.progress(plan)``, which reads the stage's files: the same
numbers whatever process or Ray worker runs a unit, and only this run's work counts toward the rate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prefect import get_run_logger
from prefect.futures import PrefectFuture, as_completed

from eagle3.config import PipelineConfig
from eagle3.stage import Plan, Stage, StageResult, Unit, UnitReport, recorded_result, result_path, unit_error
from flows.runners import shard_runner
from tasks.common import Progress, artifact_key
from tasks.stage import stage_tasks

POLL_S = 1.0  # how often the flow looks at unfinished units (and, every progress_every_s, the progress)


def run_stage(stage: Stage[Any], config: PipelineConfig, **inputs: Any) -> StageResult:
    """Plan, run every unit (a failed one never stops the others), finalize; raises ``UnitsFailed`` after
    finalizing when units failed. A plan an earlier run finished (``recorded_result``: decided from the plan and the
    files alone) ends here with that run's result: no resources, unit or finalize task, no file written."""
    plan_task, unit_task, finalize_task = stage_tasks(stage)
    plan: Plan = plan_task(stage, config, inputs)
    recorded = recorded_result(stage, plan)
    if recorded is not None:
        get_run_logger().info("%s %s: done in an earlier run (%s); nothing to do", stage.name, plan.fingerprint,
                              result_path(plan).name)  # fmt: skip
        return recorded
    tracker = _progress(stage, plan, config)
    with stage.resources(config, plan) as env, _submitter(stage, config, unit_task) as submit:
        reports, failed, causes = _run_units(lambda unit: submit({"stage": stage, "config": config, "plan": plan,
                                                          "unit": unit, "env": env}),
                                     list(plan.units), in_flight=stage.max_in_flight(config), poll=tracker)  # fmt: skip
    tracker(force=True)
    return finalize_task(stage, config, plan, reports, failed, causes)


@contextmanager
def _submitter(stage: Stage[Any], config: PipelineConfig, unit_task: Any) -> Iterator[Callable[..., Any]]:
    """Submit unit tasks on the config's task runner (threads or Ray, with the stage's placement) for scale-out
    stages, on the flow's own runner otherwise; units are waited for inside the block."""
    if not stage.scale_out:
        yield lambda parameters: unit_task.submit(**parameters)
        return
    with shard_runner(config, stage.name) as runner:  # type: ignore[arg-type]
        yield lambda parameters: runner.submit(unit_task, parameters)


def _progress(stage: Stage[Any], plan: Plan, config: PipelineConfig) -> Callable[..., None]:
    """A function that refreshes the stage's progress artifact from its files (a no-op for stages without one)."""
    first = stage.progress(plan)
    if first is None:
        return lambda force=False: None
    bar = Progress(artifact_key(stage.name, "progress", plan.fingerprint), total=first.total, unit=first.unit,
                   every_s=config.orchestration.progress_every_s, already_done=first.done)  # fmt: skip

    def refresh(force: bool = False) -> None:
        now = stage.progress(plan)
        if now is not None:
            bar.update(now.done, tokens=now.tokens or None, force=force)

    return refresh


def _run_units(
    submit: Callable[[Unit], PrefectFuture[UnitReport]], units: list[Unit], *, in_flight: int | None,
    poll: Callable[[], None],
) -> tuple[list[UnitReport], list[Unit], dict[str, str]]:  # fmt: skip
    """Submit units (at most ``in_flight`` running), wait for all; (reports of completed units, failed units, their
    errors by ``str(unit)``)."""
    running: dict[PrefectFuture[UnitReport], Unit] = {}
    reports: list[UnitReport] = []
    failed: list[Unit] = []
    causes: dict[str, str] = {}
    while units or running:
        while units and (in_flight is None or len(running) < in_flight):
            unit = units.pop(0)
            running[submit(unit)] = unit
        try:
            future = next(iter(as_completed(list(running), timeout=POLL_S)))
        except TimeoutError:
            poll()
            continue
        unit = running.pop(future)
        value = future.result(raise_on_failure=False)  # a failed unit's exception, logged by its task run
        if future.state.is_completed():
            reports.append(value)
        else:
            failed.append(unit)
            if isinstance(value, BaseException):
                causes[str(unit)] = unit_error(value)
        poll()
    return reports, failed, causes
