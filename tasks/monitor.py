"""What a person watching a long stage sees in the Prefect UI: progress, a status on the top-level
run, a live unit table and a periodic log line, all from one :class:`eagle3.stage.Progress` reading.

Where each number shows (a 40-hour regen is watched from the nightly run's page, not from a
subflow's):

* ``<stage>-progress-<fp>``: a progress artifact on the stage's own run; its description leads with
  the ETA because the UI card cuts long descriptions.
* ``<root flow>-status`` (``data-scaling-status`` for the nightly run): a Markdown artifact **on the
  top-level flow run** (the nightly run when the stage is its subflow), stable key, one for the
  whole run, updated in place by each stage in turn: the running stage,
  percent, samples, rates, ETA, failed units so far with their reasons and the exact re-trigger
  commands, and the servers' health. ``<root flow>-progress`` is the same percent as a progress
  artifact there.
* ``<stage>-<unit>s-live-<fp>``: a table artifact on the stage run, one row per unit, refreshed
  every ``orchestration.progress_every_s`` and at once when a unit fails (with the reason), so a
  shard that failed in hour 3 is visible in hour 3 (``Watch`` decides when).
* ``<stage>-<name>-live-<fp>``: the tables a stage adds beside its units (``Stage.live_tables``: the
  online train stage's ``train-producers-live-<fp>``, one row per capture producer with its state,
  batches, rate, restarts and last error, then the trainer's rate and the store's backlog),
  refreshed with the progress; the stage's ``Progress.note`` (there: backlog, samples/s, restarts)
  follows the ETA on the progress card and the status.
* A log line every ``monitor.log_every_s`` on the stage run's logger, copied into the top-level
  run's logs: the tab the nightly run's page opens on reads the running stage's numbers without a
  click.

Publishing never stops the work: a Prefect API error while refreshing a board is logged and skipped
(the next refresh retries); the stage's files stay the truth.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from uuid import UUID

import httpx
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate, LogCreate
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext
from prefect.exceptions import ObjectNotFound

from eagle3.config.pipeline import PipelineConfig
from eagle3.stage import LiveTable, Plan, Progress, RateWindow, Stage, Unit
from tasks.common import artifact_key
from tasks.stage import run_logger

logger = logging.getLogger(__name__)

REASON_CHARS = 300  # a failure reason in the tables: the exception's first line, cut


@dataclass(frozen=True)
class RootRun:
    """The top-level flow run a person watches (the run itself when it has no parent) and its
    deployment name."""

    id: UUID
    flow_name: str
    # the deployment name (``tiny`` in ``data-scaling/tiny``), None when run without one
    deployment: str | None

    @classmethod
    def of_current(cls) -> RootRun | None:
        """Walk the current flow run's parents up to the top; None outside a flow run."""
        context = FlowRunContext.get()
        run: FlowRun | None = context.flow_run if context else None
        if run is None:
            return None
        with get_client(sync_client=True) as client:
            while run.parent_task_run_id is not None:
                parent = client.read_task_run(run.parent_task_run_id)
                if parent.flow_run_id is None:
                    break
                run = client.read_flow_run(parent.flow_run_id)
            deployment = (
                client.read_deployment(run.deployment_id).name if run.deployment_id else None
            )
            return cls(run.id, client.read_flow(run.flow_id).name, deployment)


@dataclass
class UnitBoard:
    """The live state of one stage run's units: what the live table, the status and the log line
    show."""

    unit_name: str
    units: Sequence[Unit]
    states: dict[Unit, str] = field(default_factory=dict)
    reasons: dict[Unit, str] = field(default_factory=dict)
    retrigger: list[str] = field(default_factory=list)  # the commands that re-run the failed units

    def mark(self, unit: Unit, state: str, *, reason: str = "") -> None:
        self.states[unit] = state
        if reason.strip():
            self.reasons[unit] = reason.strip().splitlines()[0][:REASON_CHARS]

    @property
    def failed(self) -> list[Unit]:
        return [u for u in self.units if self.states.get(u) == "failed"]

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                self.unit_name: u,
                "state": self.states.get(u, "pending"),
                "reason": self.reasons.get(u, ""),
            }
            for u in self.units
        ]


def status_markdown(
    stage: str,
    progress: Progress,
    board: UnitBoard | None,
    health: Sequence[Mapping[str, Any]],
    *,
    state: str,
    tables: Mapping[str, LiveTable] | None = None,
) -> str:
    """The at-a-glance status of the running stage (the Markdown artifact on the top-level run)."""
    lines = [
        f"# {stage} {state}: {progress.percent:.1f}% - ETA {progress.eta}",
        "",
        f"**{progress.done:,} / {progress.total:,} {progress.unit}** - {_rates(progress)}",
    ]
    if progress.note:
        lines += ["", progress.note]
    for name, table in (tables or {}).items():
        lines += ["", f"**{name}**", "", *markdown_table(table.rows)]
    if board is not None:
        failed = board.failed
        lines += [
            "",
            f"**Failed {board.unit_name}s so far: {len(failed)}**"
            + (f" {failed}" if failed else ""),
        ]
        lines += [
            f"- {board.unit_name} {u}: {board.reasons.get(u) or 'no reason recorded'}"
            for u in failed
        ]
        if failed and board.retrigger:
            lines += [
                "",
                "Re-run only those:",
                "",
                *(f"    {command}" for command in board.retrigger),
            ]
    if health:
        lines += [
            "",
            "| server | state | requests done | errors | error rate |",
            "|---|---|---|---|---|",
        ]
        for server in health:
            attempts = int(server["completed"]) + int(server["errors"])
            rate = f"{100.0 * int(server['errors']) / attempts:.1f}%" if attempts else "-"
            lines.append(
                f"| {server['url']} | {'healthy' if server['healthy'] else '**ejected**'} | "
                f"{server['completed']:,} | {server['errors']:,} | {rate} |"
            )
    return "\n".join(lines) + "\n"


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """``rows`` (dicts with the same keys) as the lines of a Markdown table."""
    if not rows:
        return []
    keys = list(rows[0])
    return [
        f"| {' | '.join(keys)} |",
        f"|{'---|' * len(keys)}",
        *(f"| {' | '.join(str(row.get(k, '')).replace('|', '/') for k in keys)} |" for row in rows),
    ]


def status_line(
    stage: str, progress: Progress, board: UnitBoard | None, health: Sequence[Mapping[str, Any]]
) -> str:
    """The same numbers as one log line (every ``monitor.log_every_s``)."""
    line = f"{stage}: {progress.describe()}"
    if board is not None:
        line += f" - failed {board.unit_name}s: {board.failed or 'none'}"
    if health:
        line += " - servers: " + ", ".join(
            f"{s['url']} {'ok' if s['healthy'] else 'EJECTED'} ({s['errors']} errors)"
            for s in health
        )
    return line


def _rates(progress: Progress) -> str:
    if progress.waiting and not progress.finished:
        return progress.waiting
    if progress.per_s is None:
        return "rate unknown yet"
    text = f"{progress.per_s:,.2f} {progress.unit}/s"
    return text + (f" - {progress.tokens_per_s:,.0f} tokens/s" if progress.tokens_per_s else "")


def card_description(progress: Progress) -> str:
    """A progress card's description: the ETA first (the UI card cuts the end), then the rate and
    the stage's note."""
    text = f"ETA {progress.eta} - {progress.done:,}/{progress.total:,} {progress.unit}"
    if progress.tokens_per_s:
        text += f" - {progress.tokens_per_s:,.0f} tok/s"
    return text + (f" - {progress.note}" if progress.note else "")


class StageMonitor:
    """Publishes one stage run's progress everywhere a person looks (see the module docstring).

    ``update`` takes a fresh reading of the stage's files; the rates come from this run's readings
    only (:class:`RateWindow`), so work finished before the run counts toward the bar, never toward
    the rate.
    """

    def __init__(
        self,
        stage: str,
        fingerprint: str,
        first: Progress,
        *,
        board: UnitBoard | None = None,
        log_every_s: float = 300.0,
        window_s: float = 300.0,
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.stage, self.board, self.log, self.log_every_s = stage, board, log, log_every_s
        self.rates = RateWindow(window_s)
        self.progress = self.rates.observe(first)
        self.health: Sequence[Mapping[str, Any]] = ()
        self.fingerprint, self.tables = fingerprint, dict[str, LiveTable]()
        self._live: dict[str, tuple[UUID, LiveTable]] = {}  # name -> (artifact id, what it shows)
        self._logged = time.monotonic()
        self._progress_id: UUID = create_progress_artifact(
            progress=self.progress.percent,
            key=artifact_key(stage, "progress", fingerprint),
            description=card_description(self.progress),
        )  # type: ignore[assignment]
        self._table_key = (
            artifact_key(stage, f"{board.unit_name}s-live", fingerprint) if board else ""
        )
        self._table_id: UUID | None = None
        self._table_rows: list[dict[str, Any]] = []
        self.root = RootRun.of_current()
        self._status_ids: tuple[UUID, UUID] | None = None
        self.say(status_line(stage, self.progress, board, ()))
        self.publish(state="running")

    def update(
        self,
        progress: Progress,
        *,
        health: Sequence[Mapping[str, Any]] = (),
        state: str = "running",
        tables: Mapping[str, LiveTable] | None = None,
    ) -> None:
        """A new reading (``tables``: the stage's live tables): refresh the artifacts, and log the
        status line when ``log_every_s`` has passed."""
        self.progress, self.health, self.tables = (
            self.rates.observe(progress),
            health,
            dict(tables or {}),
        )
        self.publish(state=state, bar=True)
        if state != "running" or time.monotonic() - self._logged >= self.log_every_s:
            self._logged = time.monotonic()
            self.say(status_line(self.stage, self.progress, self.board, health))

    def say(self, line: str) -> None:
        """Log ``line`` on the stage run and, when the stage is a subflow, in the top-level run's
        logs too (the tab its page opens on), so the nightly page reads the running stage's numbers
        without a click."""
        self.log.info("%s", line)
        context = FlowRunContext.get()
        if (
            self.root is None
            or context is None
            or context.flow_run is None
            or context.flow_run.id == self.root.id
        ):
            return
        try:
            record = LogCreate(
                name="eagle3.monitor",
                level=logging.INFO,
                message=line,
                timestamp=datetime.now(timezone.utc),
                flow_run_id=self.root.id,
            )
            with get_client(sync_client=True) as client:
                client.create_logs([record])
        except httpx.HTTPError as exc:
            self.log.warning("could not copy the status line to the top-level run's logs: %s", exc)

    def publish(self, *, state: str, bar: bool = False) -> None:
        """Refresh the live unit table, the top-level run's status and (``bar``) the stage's
        progress artifact; an API error is logged, not raised: a 40-hour stage never dies of a
        dashboard."""
        try:
            if bar:
                update_progress_artifact(
                    artifact_id=self._progress_id,
                    progress=self.progress.percent,
                    description=card_description(self.progress),
                )
            self._publish_table()
            self._publish_live_tables()
            self._publish_status(state)
        except httpx.HTTPError as exc:
            self.log.warning(
                "could not refresh the %s status artifacts (retried at the next refresh): %s",
                self.stage,
                exc,
            )

    def _publish_table(self) -> None:
        if self.board is None or self.board.rows() == self._table_rows:
            return  # unchanged since the last refresh: no write
        rows, failed = self.board.rows(), self.board.failed
        description = (
            f"failed: {failed}; re-run: {self.board.retrigger[0]}"
            if failed and self.board.retrigger
            else f"{self.stage} {self.board.unit_name}s, live"
        )
        self._table_rows = rows
        if self._table_id is None:
            self._table_id = create_table_artifact(
                table=rows, key=self._table_key, description=description
            )  # type: ignore[assignment]
            return
        with get_client(sync_client=True) as client:
            client.update_artifact(
                self._table_id, ArtifactUpdate(data=json.dumps(rows), description=description)
            )

    def _publish_live_tables(self) -> None:
        """Each of the stage's live tables as ``<stage>-<name>-live-<fp>``, written only when it
        changed."""
        for name, table in self.tables.items():
            earlier = self._live.get(name)
            if earlier is not None and earlier[1] == table:
                continue
            if earlier is None:
                artifact_id = create_table_artifact(
                    table=table.rows,
                    key=artifact_key(self.stage, f"{name}-live", self.fingerprint),
                    description=table.description,
                )
                self._live[name] = (artifact_id, table)  # type: ignore[assignment]
                continue
            with get_client(sync_client=True) as client:
                client.update_artifact(
                    earlier[0],
                    ArtifactUpdate(data=json.dumps(table.rows), description=table.description),
                )
            self._live[name] = (earlier[0], table)

    def _publish_status(self, state: str) -> None:
        if self.root is None:
            return
        markdown = status_markdown(
            self.stage, self.progress, self.board, self.health, state=state, tables=self.tables
        )
        failed = (
            f" - {len(self.board.failed)} failed"
            if self.board is not None and self.board.failed
            else ""
        )
        description = (
            f"{self.stage} {state} {self.progress.percent:.1f}% - ETA {self.progress.eta}{failed}"
        )
        with get_client(sync_client=True) as client:
            if self._status_ids is None:
                self._status_ids = self._earlier_status(client)
            if self._status_ids is None:
                status = client.create_artifact(
                    ArtifactCreate(
                        key=artifact_key(self.root.flow_name, "status"),
                        type="markdown",
                        data=markdown,
                        description=description,
                        flow_run_id=self.root.id,
                    )
                )
                bar = client.create_artifact(
                    ArtifactCreate(
                        key=artifact_key(self.root.flow_name, "progress"),
                        type="progress",
                        data=self.progress.percent,
                        description=description,
                        flow_run_id=self.root.id,
                    )
                )
                self._status_ids = (status.id, bar.id)
                return
            client.update_artifact(
                self._status_ids[0], ArtifactUpdate(data=markdown, description=description)
            )
            client.update_artifact(
                self._status_ids[1],
                ArtifactUpdate(data=self.progress.percent, description=description),
            )

    def _earlier_status(self, client: SyncPrefectClient) -> tuple[UUID, UUID] | None:
        """The status artifacts an earlier stage of the same top-level run created (updated in
        place, so the run shows one status card and one progress card for the whole night, not two
        per stage)."""
        assert self.root is not None
        keys = [
            artifact_key(self.root.flow_name, "status"),
            artifact_key(self.root.flow_name, "progress"),
        ]
        latest = {
            a.key: a
            for a in client.read_latest_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys))
            )
        }
        found = [latest.get(key) for key in keys]
        if all(a is not None and a.flow_run_id == self.root.id for a in found):
            return found[0].latest_id, found[1].latest_id  # type: ignore[union-attr]
        return None


class Watch:
    """The stage run's progress as a person sees it (the boards above): read from
    ``stage.progress(plan)`` (the stage's files) and published at most every
    ``orchestration.progress_every_s``, whether units start, finish or neither; a failed unit is
    published at once (with its reason and re-trigger commands), and so is the end.

    A refresh costs several API writes and reads every unit's files, so doing it per unit started or
    finished made Prefect's bookkeeping grow with the shard count (7 artifact writes per shard, ~2 s
    a shard on a busy machine, measured in ``benchmarks/regen_scale.py --flow-overhead``); per
    period it is a constant.

    A stage without a file-based progress counts finished units. The unit board (the live table, the
    failed units and their re-trigger commands) is kept for scale-out stages (regen, capture: many
    shards).
    """

    def __init__(self, stage: Stage[Any], plan: Plan, config: PipelineConfig, env: Any) -> None:
        self.stage, self.plan, self.config, self.env = stage, plan, config, env
        self.units_done, self.units_failed = 0, 0
        self._read_at = time.monotonic()
        board = UnitBoard(stage.unit_name, list(plan.units)) if stage.scale_out else None
        self.monitor = StageMonitor(
            stage.name,
            plan.fingerprint,
            self.read(),
            board=board,
            log=run_logger(),
            log_every_s=config.monitor.log_every_s,
            window_s=config.monitor.rate_window_s,
        )

    def read(self) -> Progress:
        progress = self.stage.progress(self.plan)
        if progress is None:
            progress = Progress(
                done=self.units_done, total=len(self.plan.units), unit=f"{self.stage.unit_name}s"
            )
        return progress

    def poll(self, *, force: bool = False, state: str = "running") -> None:
        if (
            not force
            and time.monotonic() - self._read_at < self.config.orchestration.progress_every_s
        ):
            return
        self._read_at = time.monotonic()
        progress = self.read()
        if state == "done":
            # every unit finished: the plan is done, whatever a file lags behind
            progress = progress.complete()
        self.monitor.update(
            progress,
            health=self.stage.health(self.config, self.env),
            state=state,
            tables=self.stage.live_tables(self.plan),
        )

    def started(self, unit: Unit) -> None:
        """Mark ``unit`` running (called before its submit: a refresh due now shows it before the
        unit can look)."""
        if self.monitor.board is not None:
            self.monitor.board.mark(unit, "running")
        self.poll()

    def finished(self, unit: Unit, error: BaseException | None) -> None:
        board = self.monitor.board
        self.units_done += error is None
        self.units_failed += error is not None
        if board is not None:
            board.mark(
                unit,
                "done" if error is None else "failed",
                reason="" if error is None else str(error),
            )
            if error is not None:
                board.retrigger = retrigger_commands(
                    self.stage, self.plan, board.failed, self.monitor.root, self.config.name
                )
        self.poll(force=error is not None)

    def finish(self) -> None:
        self.poll(force=True, state="failed" if self.units_failed else "done")


def retrigger_commands(
    stage: Stage[Any], plan: Plan, failed: list[Unit], root: RootRun | None, config_name: str
) -> list[str]:
    """The exact commands that re-run only ``failed``: the stage's deployment (when the server has
    one, as ``deploy.py apply`` creates for regen) and the stage's own CLI command."""
    commands = []
    name = f"{stage.name}/{(root.deployment if root else None) or config_name}"
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
            commands.append(
                f"prefect deployment run '{name}' --param shard_ids='{json.dumps(sorted(failed))}'"
            )
        except ObjectNotFound:
            pass  # no such deployment: the CLI command below is the way
    return [*commands, stage.retrigger(plan, failed)]
