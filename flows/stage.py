"""The one wiring of a stage flow: plan -> units (bounded, placed, followed) -> finalize.

Every stage flow (``flows/<stage>.py``) is a named ``@flow`` whose body calls :func:`run_stage`. Units are submitted
at most ``stage.max_in_flight(config)`` at a time, inside ``stage.resources`` (regen's servers): a scale-out stage's
(regen, capture) on the config's task runner with its Ray placement (``flows.runners.shard_runner``), any other's
on the flow's own runner. While they run, :class:`Watch` publishes the stage's progress (``tasks.monitor``: the
stage run's progress artifact and live unit table, the top-level run's status, a periodic log line) from
``stage.progress(plan)``, which reads the stage's files: the same numbers whatever process or Ray worker runs a
unit, and only this run's work counts toward the rate.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.futures import PrefectFuture, as_completed

from eagle3.config.pipeline import PipelineConfig
from eagle3.stage import (
    Plan,
    Progress,
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
from tasks.monitor import RootRun, StageMonitor, UnitBoard
from tasks.stage import existing_limits, run_logger, stage_tasks

POLL_S = 1.0  # how often the flow looks at unfinished units (and, every progress_every_s, the progress)


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
        run_logger().info("%s %s: done in an earlier run (%s); nothing to do", stage.name, plan.fingerprint,
                          result_path(plan).name)  # fmt: skip
        return recorded
    limits = existing_limits(stage.concurrency_limits(config))
    import_for_units(stage, config)  # here, not in units that start together: lazy imports race (eagle3.stage)
    with stage.resources(config, plan) as env, _submitter(stage, config, unit_task) as submit:
        watch = Watch(stage, plan, config, env)
        reports, failed, causes = _run_units(lambda unit: submit({"stage": stage, "config": config, "plan": plan,
                                                                  "unit": unit, "env": env, "limits": limits}),
                                             list(plan.units), in_flight=stage.max_in_flight(config),
                                             watch=watch)  # fmt: skip
        watch.finish()
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


class Watch:
    """The stage run's progress as a person sees it (``tasks.monitor``): read from ``stage.progress(plan)`` (the
    stage's files) and published at most every ``orchestration.progress_every_s``, whether units start, finish or
    neither; a failed unit is published at once (with its reason and re-trigger commands), and so is the end.

    A refresh costs several API writes and reads every unit's files, so doing it per unit started or finished made
    Prefect's bookkeeping grow with the shard count (7 artifact writes per shard, ~2 s a shard on a busy machine,
    measured in ``benchmarks/regen_scale.py --flow-overhead``); per period it is a constant.

    A stage without a file-based progress counts finished units. The unit board (the live table, the failed units
    and their re-trigger commands) is kept for scale-out stages (regen, capture: many shards).
    """

    def __init__(self, stage: Stage[Any], plan: Plan, config: PipelineConfig, env: Any) -> None:
        self.stage, self.plan, self.config, self.env = stage, plan, config, env
        self.units_done, self.units_failed = 0, 0
        self._read_at = time.monotonic()
        board = UnitBoard(stage.unit_name, list(plan.units)) if stage.scale_out else None
        self.monitor = StageMonitor(stage.name, plan.fingerprint, self.read(), board=board, log=run_logger(),
                                    log_every_s=config.monitor.log_every_s,
                                    window_s=config.monitor.rate_window_s)  # fmt: skip

    def read(self) -> Progress:
        progress = self.stage.progress(self.plan)
        if progress is None:
            progress = Progress(done=self.units_done, total=len(self.plan.units), unit=f"{self.stage.unit_name}s")
        return progress

    def poll(self, *, force: bool = False, state: str = "running") -> None:
        if not force and time.monotonic() - self._read_at < self.config.orchestration.progress_every_s:
            return
        self._read_at = time.monotonic()
        progress = self.read()
        if state == "done":
            progress = progress.complete()  # every unit finished: the plan is done, whatever a file lags behind
        self.monitor.update(progress, health=self.stage.health(self.config, self.env), state=state,
                            tables=self.stage.live_tables(self.plan))  # fmt: skip

    def started(self, unit: Unit) -> None:
        """Mark ``unit`` running (called before its submit: a refresh due now shows it before the unit can look)."""
        if self.monitor.board is not None:
            self.monitor.board.mark(unit, "running")
        self.poll()

    def finished(self, unit: Unit, error: BaseException | None) -> None:
        board = self.monitor.board
        self.units_done += error is None
        self.units_failed += error is not None
        if board is not None:
            board.mark(unit, "done" if error is None else "failed", reason="" if error is None else str(error))
            if error is not None:
                board.retrigger = retrigger_commands(self.stage, self.plan, board.failed, self.monitor.root,
                                                     self.config.name)  # fmt: skip
        self.poll(force=error is not None)

    def finish(self) -> None:
        self.poll(force=True, state="failed" if self.units_failed else "done")


def retrigger_commands(
    stage: Stage[Any], plan: Plan, failed: list[Unit], root: RootRun | None, config_name: str
) -> list[str]:
    """The exact commands that re-run only ``failed``: the stage's deployment (when the server has one, as
    ``deploy.py apply`` creates for regen) and the stage's own CLI command."""
    commands = []
    name = f"{stage.name}/{(root.deployment if root else None) or config_name}"
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
            commands.append(f"prefect deployment run '{name}' --param shard_ids='{json.dumps(sorted(failed))}'")
        except ObjectNotFound:
            pass  # no such deployment: the CLI command below is the way
    return [*commands, stage.retrigger(plan, failed)]


def _run_units(
    submit: Callable[[Unit], PrefectFuture[UnitReport]], units: list[Unit], *, in_flight: int | None, watch: Watch,
) -> tuple[list[UnitReport], list[Unit], dict[str, UnitFailure]]:  # fmt: skip
    """Submit units (at most ``in_flight`` running), wait for all; (reports of completed units, failed units, their
    errors by ``str(unit)``)."""
    running: dict[PrefectFuture[UnitReport], Unit] = {}
    reports: list[UnitReport] = []
    failed: list[Unit] = []
    causes: dict[str, UnitFailure] = {}
    while units or running:
        while units and (in_flight is None or len(running) < in_flight):
            unit = units.pop(0)
            watch.started(unit)  # before the submit: the table must say "running" by the time the unit can look
            running[submit(unit)] = unit
        try:
            future = next(iter(as_completed(list(running), timeout=POLL_S)))
        except TimeoutError:
            watch.poll()
            continue
        unit = running.pop(future)
        value = future.result(raise_on_failure=False)  # a failed unit's exception, logged by its task run
        if future.state.is_completed():
            reports.append(value)
            watch.finished(unit, None)
        else:
            failed.append(unit)
            if isinstance(value, BaseException):
                causes[str(unit)] = unit_failure(value)
            watch.finished(unit, value if isinstance(value, BaseException) else RuntimeError(future.state.message))
    return reports, failed, causes
