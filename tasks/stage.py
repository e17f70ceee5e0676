"""The generic Prefect tasks of every stage (``eagle3.stage``): plan, one task per unit, finalize.

A stage adds nothing here but its name, unit name and retries (``Stage`` class attributes) and,
where it truly differs, its concurrency limit names (regen: one slot per persistent server). The
unit task's cache key is the stage, its plan fingerprint and the unit, plus the size and mtime of
the unit's output file, and there is no key while that file is missing (``output_cache_key``): the
library already skips a finished unit cheaply, so the cache is only a shortcut that can never serve
a unit whose output was deleted or cut short. A plan already done (``eagle3.stage.recorded_result``)
never reaches the unit tasks: ``flows.stage.run_stage`` returns its recorded result. Library log
records (``eagle3.*``) logged in a run also go to that run's logs (``LibraryRunLogs``), so the
Prefect UI shows what the library says, and the console prints them once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.concurrency.sync import concurrency
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import MissingContextError, ObjectNotFound
from prefect.logging.handlers import APILogHandler
from prefect.states import State

from eagle3.config.pipeline import PipelineConfig
from eagle3.errors import DataError, Stopped
from eagle3.lineage import Lineage
from eagle3.runtime.stop import stop_requested
from eagle3.stage import (
    Plan,
    Stage,
    StageResult,
    Unit,
    UnitFailure,
    UnitReport,
    record_result,
    run_unit,
)
from tasks.common import artifact_key, output_cache_key, publish_markdown, publish_table


def run_logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The run logger inside a flow or task run; this module's logger when a task is called as
    ``task.fn``."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


class LibraryRunLogs(APILogHandler):
    """Sends the library's log records (``eagle3.*``, INFO and up) to the Prefect API, in the run
    (task, else flow) whose context logs them, as ``<logger>: <message>``: the UI shows what the
    library says in the run it is about.

    To the API only: the record reaches the console through the logging tree as every record does,
    so a console prints each line once (a forward to the run logger printed it a second time, as
    ``prefect.task_runs: eagle3.x:
    ...``). One handler for the process, routed by the logging thread's run context (a handler per
    unit task sent each record to every unit running at the time); a record logged outside any run
    goes nowhere here."""

    def emit(self, record: logging.LogRecord) -> None:
        if TaskRunContext.get() is not None or FlowRunContext.get() is not None:
            super().emit(record)


def send_library_logs_to_runs() -> None:
    """Attach one :class:`LibraryRunLogs` to the ``eagle3`` logger (once per process: this module
    calls it)."""
    library = logging.getLogger("eagle3")
    if not any(isinstance(handler, LibraryRunLogs) for handler in library.handlers):
        handler = LibraryRunLogs(logging.INFO)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        library.addHandler(handler)


send_library_logs_to_runs()


@task(name="plan", cache_policy=NO_CACHE)
def plan_task(stage: Stage[Any], config: PipelineConfig, inputs: dict[str, Any]) -> Plan:
    """The stage's plan (fingerprint, output directory, units) from the config and the upstream
    directories: given paths win, the others are the directories this config names (the one input
    rule, ``eagle3.lineage``)."""
    plan = stage.plan(config, **Lineage(config).resolve_inputs(stage.inputs, inputs))
    run_logger().info(
        "%s %s -> %s: %d %ss %s",
        stage.name,
        plan.fingerprint,
        plan.out_dir,
        len(plan.units),
        stage.unit_name,
        list(plan.units),
    )
    return plan


def unit_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    """Stage, plan fingerprint and unit, plus the unit output's size and mtime; None (no cache)
    while it is missing."""
    stage, plan, unit = parameters["stage"], parameters["plan"], parameters["unit"]
    output = stage.unit_output(plan, unit)
    return (
        None
        if output is None
        else output_cache_key(f"{stage.name}-{plan.fingerprint}-{unit}", output)
    )


def retry_unless_data_error_or_stopped(task: Any, task_run: Any, state: State) -> bool:
    """Prefect's retry condition of unit tasks: retries are for infrastructure; a ``DataError``
    fails at once (the same data fails the same way), so its message is not buried under the
    retries' tracebacks. So does an ``ImportError`` (a missing package stays missing). A ``Stopped``
    unit (SIGTERM, Ctrl-C), or any unit that fails once the run is stopping
    (``eagle3.runtime.stop``), stays stopped instead of being retried after the delay."""
    final = (DataError, Stopped, ImportError)
    return stop_requested() is None and not isinstance(state.data, final)


def existing_limits(names: Sequence[str]) -> list[str]:
    """The names among ``names`` of concurrency limits the Prefect server has
    (``deployments/deploy.py`` creates them), asked once per stage run: a unit asking for a missing
    limit costs an API call and a warning per unit, and on a busy SQLite server a 503 and a retry
    (~2 s a shard, measured)."""
    found = []
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                client.read_global_concurrency_limit_by_name(name)
                found.append(name)
            except ObjectNotFound:
                pass  # no such limit: the unit holds no slot of it
    return found


@task(
    name="unit",
    cache_key_fn=unit_cache_key,
    persist_result=True,
    retry_delay_seconds=10,
    retry_condition_fn=retry_unless_data_error_or_stopped,
)
def unit_task(
    stage: Stage[Any],
    config: PipelineConfig,
    plan: Plan,
    unit: Unit,
    env: Any = None,
    limits: Sequence[str] = (),
) -> UnitReport:
    """Run one unit (resumable: a retry or a re-run picks up where the last attempt stopped),
    holding a slot of each of ``limits`` (the stage's concurrency limits that exist:
    :func:`existing_limits`)."""
    with concurrency(list(limits), occupy=1, strict=False) if limits else nullcontext():
        report = run_unit(stage, config, plan, unit, env=env)
    run_logger().info(
        "%s %s %s: %s",
        stage.name,
        stage.unit_name,
        unit,
        "already done" if report.skipped else report.model_dump(exclude={"unit"}),
    )
    return report


@task(name="finalize", cache_policy=NO_CACHE)
def finalize_task(
    stage: Stage[Any],
    config: PipelineConfig,
    plan: Plan,
    reports: list[UnitReport],
    failed: list[Unit],
    causes: dict[str, UnitFailure] | None = None,
) -> StageResult:
    """Finalize (manifest when complete), record a successful result (a re-run of this plan reads it
    back), publish the unit table and the summary, then apply the failure policy (``causes``: the
    failed units' errors, which end its message)."""
    result = stage.finalize(config, plan, reports, failed)
    record_result(stage, plan, result)
    if result.table:
        key = stage.table_key or artifact_key(stage.name, f"{stage.unit_name}s", plan.fingerprint)
        publish_table(
            key,
            result.table,
            description=result.description or f"{stage.name} {stage.unit_name} states",
        )
    if result.markdown:
        key = stage.summary_key or artifact_key(stage.name, "summary", plan.fingerprint)
        publish_markdown(
            key, result.markdown, description=result.description or f"{stage.name} summary"
        )
    return result.raise_for_failed(causes)


def stage_tasks(stage: Stage[Any]) -> tuple[Any, Any, Any]:
    """The plan, unit and finalize tasks named for ``stage`` (``capture-plan``, ``capture-shard``,
    ...).

    No task tags: Prefect (3.9) makes each run of a tagged task acquire a concurrency lease on
    ``tag:<tag>``, limit or not, and once its 5 s "no such limit" cache has expired (any unit longer
    than that) the acquisition holds the next unit ~2 s between Pending and Running (measured: 3 of
    4 regen shards, PrefectHQ/prefect#19367). A stage's limits are the explicit ones of
    ``concurrency_limits``, and the task names already say the stage."""
    return (
        plan_task.with_options(name=f"{stage.name}-plan"),
        unit_task.with_options(name=f"{stage.name}-{stage.unit_name}", retries=stage.retries),
        finalize_task.with_options(name=f"{stage.name}-finalize"),
    )
