"""The stage contract: every stage of the pipeline has one shape, so one set of Prefect tasks and
one library runner drive them all.

::

    plan(config, **inputs) -> Plan          what to do: fingerprint, output directory, units (quick; writes at most
                                            plan.json); ``inputs`` names the upstream directories it takes: the
                                            caller passes explicit paths or lets eagle3.lineage find the config's
    idle(plan) -> StageResult | None        the result of a plan with nothing to run (capture of an
                                            online night), returned without running anything;
                                            default: None
    resources(config, plan)                 a context for the units' length (regen: the servers); default: none
    run_unit(config, plan, unit, env, on_progress) -> UnitReport
                                            one unit (a shard, a source, or the stage's single unit); resumable:
                                            a finished unit is skipped cheaply, an interrupted one resumes
    unit_output(plan, unit) -> Path | None  the file whose presence marks the unit done (its Prefect cache key)
    progress(plan) -> Progress | None       work done / planned by this run, read from files (a CLI bar, the Prefect
                                            artifacts and status, the log line); None: finished units count
    health(config, env) -> list[dict]       the resources' state while units run (regen: each server's health)
    finalize(config, plan, reports, failed) -> StageResult
                                            records failed units (then the caller raises ``UnitsFailed`` with
                                            the re-trigger command); else writes the manifest (the done marker)

A run that succeeds records its result beside its outputs (``record_result``). A later run of the
same plan reads it back (``recorded_result``) while every unit's output and the manifest are
unchanged since, and does nothing else: no resources (regen's reference server), no unit, no
finalize, no file written. A finished night costs its plans, not a server start, a trainer launch or
a re-export.

Plans, unit reports and results are frozen pydantic models: JSON on the wire (Prefect task
parameters, Ray) and on disk. The config crosses every boundary as the validated ``PipelineConfig``;
a stage never re-reads it.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from eagle3.config.pipeline import PipelineConfig
from eagle3.errors import DataError
from eagle3.rundir.layout import FAILED_SHARDS_FILE, stage_result_file, write_failed_shards
from eagle3.rundir.runroot import MANIFEST, atomic_path, fingerprint
from eagle3.runtime.stop import raise_if_stopped, raise_pending_stop, stop_on_signals

logger = logging.getLogger(__name__)

Unit = int | str
OnProgress = Callable[[int, int], None]  # (work items done in this unit, tokens done in this unit)


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Plan(Frozen):
    """What one run of a stage does. Stages subclass it with their own typed fields."""

    stage: str
    fingerprint: str
    out_dir: Path
    # the units this run executes (shard ids, source names, or the single unit 0)
    units: tuple[Unit, ...] = (0,)


class UnitReport(Frozen):
    unit: Unit
    skipped: bool = False  # already done on disk before this run
    rows: int = 0
    tokens: int = 0
    detail: dict[str, Any] = Field(default_factory=dict)


class StageResult(Frozen):
    stage: str
    fingerprint: str
    out_dir: Path
    done: bool  # the manifest is written
    failed: tuple[Unit, ...] = ()  # units that failed in this run (recorded in failed_shards.json)
    retrigger: str = ""  # the command that re-runs only the failed units
    summary: dict[str, Any] = Field(default_factory=dict)
    # one row per unit, for a table artifact
    table: list[dict[str, Any]] = Field(default_factory=list)
    markdown: str = ""
    # a one-line verdict for the artifacts' descriptions (the gate's PASS/FAIL, the curve's)
    description: str = ""

    def raise_for_failed(self, causes: Mapping[str, UnitFailure] | None = None) -> StageResult:
        """The one failure policy: a stage with failed units fails, after finalize recorded them
        (and after the caller published the table), with the re-trigger command and each unit's
        error (``causes``, by ``str(unit)``): ``UnitsDamaged`` when one of them read damaged input,
        else ``UnitsFailed``; otherwise returns itself."""
        if self.failed:
            damaged = any(cause.damaged for cause in (causes or {}).values())
            raise (UnitsDamaged if damaged else UnitsFailed)(
                self.stage, self.out_dir, self.failed, self.retrigger, causes=causes
            )
        return self


class Progress(Frozen):
    """Work done / planned by one run of a stage: the one progress model behind the Prefect
    artifacts, the periodic log line, ``eagle3 <stage> status`` and the CLI bars.

    ``total`` is what this run planned (tonight's shards, a re-trigger's, a resume's); ``done``
    counts those units' finished work, including work finished before this run (a resume starts at
    its share). The rates are this run's work only, smoothed over a window (:class:`RateWindow`, or
    the journals' finish times for ``regen status``); None until there is something to measure, so a
    fresh or resumed run shows "ETA unknown", never a made-up one.
    """

    done: int
    total: int
    tokens: int = 0
    unit: str = "samples"
    per_s: float | None = None  # ``unit`` per second, this run's work over the recent window
    tokens_per_s: float | None = None
    # what the work waits for while nothing is served ("waiting for servers for 9s (fails at
    # 300s)"): no rate and no ETA meanwhile, whatever ``done`` does (regen's pre-tokenized samples
    # need no server and still count)
    waiting: str | None = None
    # what else a person watching needs beside the bar, short (the online train stage: the store's
    # backlog, the trainer's samples/s, the producers and their restarts); shown after the ETA on
    # the card and in the log line
    note: str | None = None
    # regen: tokens of the items still running (part of ``tokens``) and the tokens an item takes;
    # with both and a token rate the ETA is the tokens left over that rate, so long items in flight
    # count before they finish
    tokens_in_flight: int = 0
    tokens_per_item: float | None = None
    in_flight: int = 0  # items running now (their tokens: ``tokens_in_flight``)

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    @property
    def percent(self) -> float:
        """0-100; a stage with nothing planned is finished (100)."""
        return 100.0 if self.total <= 0 else min(100.0, 100.0 * self.done / self.total)

    @property
    def eta_s(self) -> float | None:
        if self.finished:
            return 0.0
        if self.waiting:
            return None
        if self.tokens_per_item and self.tokens_per_s:
            left = (self.total - self.done) * self.tokens_per_item - self.tokens_in_flight
            # the items not started take the mean at least, whatever the running ones are credited
            # (the items that finished first are the short ones: a long one in flight may run past
            # the mean)
            unstarted = (self.total - self.done - self.in_flight) * self.tokens_per_item
            return max(left, unstarted, 0.0) / self.tokens_per_s
        return (self.total - self.done) / self.per_s if self.per_s else None

    @property
    def eta(self) -> str:
        """The ETA a person reads: "31 h 12 min", "4 min 10 s", "done" or "unknown"."""
        if self.finished:
            return "done"
        return "unknown" if self.eta_s is None else human_duration(self.eta_s)

    def complete(self) -> Progress:
        """This progress with every planned item done (a stage whose units all finished is at
        100%)."""
        return self.model_copy(update={"done": max(self.done, self.total)})

    def describe(self) -> str:
        """One line: "62.5% - 125/200 samples - 1.30 samples/s, 420 tok/s - ETA 31 h 12 min", or
        while nothing is served "62.5% - 125/200 samples - waiting for servers for 9s (fails at
        300s)"."""
        head = f"{self.percent:.1f}% - {self.done:,}/{self.total:,} {self.unit}"
        if self.waiting and not self.finished:
            return f"{head} - {self.waiting}"
        rate = "rate unknown" if self.per_s is None else f"{self.per_s:,.2f} {self.unit}/s"
        if self.tokens_per_s:
            rate += f", {self.tokens_per_s:,.0f} tok/s"
        return f"{head} - {rate} - ETA {self.eta}" + (f" - {self.note}" if self.note else "")


class LiveTable(Frozen):
    """A table a person watches while a stage runs (``Stage.live_tables``), refreshed with its
    progress."""

    rows: list[dict[str, Any]]
    description: str


def human_duration(seconds: float) -> str:
    """Seconds as a person reads them: "31 h 12 min", "4 min 10 s", "12 s" (a 40-hour job is not
    "2,400 min")."""
    s = max(round(seconds), 0)
    hours, minutes, secs = s // 3600, s % 3600 // 60, s % 60
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


class RateWindow:
    """Turns successive readings of a stage's :class:`Progress` into rates over the last
    ``window_s`` seconds.

    The first reading is the baseline, so work finished before this run (a resume, shards done on an
    earlier night) never inflates the rate; a stall longer than the window brings the rate to 0 (ETA
    unknown), and a burst is averaged over the window instead of swinging the ETA.
    """

    def __init__(
        self, window_s: float = 300.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s, self._clock = window_s, clock
        self._points: deque[tuple[float, int, int]] = deque()

    def observe(self, progress: Progress) -> Progress:
        """``progress`` with ``per_s`` and ``tokens_per_s`` measured up to now."""
        now = self._clock()
        # nothing is served: the rate starts again from the last reading of the wait
        if progress.waiting:
            self._points.clear()
        self._points.append((now, progress.done, progress.tokens))
        while len(self._points) > 2 and self._points[1][0] <= now - self.window_s:
            # keep one reading at or before the window's start: the span covers the window
            self._points.popleft()
        start, done0, tokens0 = self._points[0]
        span = now - start
        if span <= 0:
            return progress
        return progress.model_copy(
            update={
                "per_s": max(progress.done - done0, 0) / span,
                "tokens_per_s": max(progress.tokens - tokens0, 0) / span,
            }
        )


class UnitFailure(Frozen):
    """How a unit failed, as the stage's failure line ends with it (``unit_failure``). ``damaged``:
    its error is a ``DataError``, so running it again fails the same way until its input is
    rebuilt."""

    message: str
    damaged: bool = False


def unit_failure(exc: BaseException) -> UnitFailure:
    """A unit's error: its message's first line, after its type unless it is a ``DataError`` (whose
    message is the whole story: the file, what is wrong, the fix)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, DataError):
        return UnitFailure(message=first, damaged=True)
    return UnitFailure(message=f"{type(exc).__name__}: {first}")


class UnitsFailed(RuntimeError):
    """The one failure policy: the stage ran every other unit, recorded the failed ones
    (``failed_shards.json``), wrote no manifest, and says how to re-run just those."""

    def __init__(
        self,
        stage: str,
        out_dir: Path | str,
        units: Sequence[Unit],
        retrigger: str,
        *,
        causes: Mapping[str, UnitFailure] | None = None,
    ) -> None:
        self.stage, self.out_dir, self.units = stage, Path(out_dir), sorted(set(units), key=str)
        causes = {
            str(unit): causes[str(unit)] for unit in self.units if str(unit) in (causes or {})
        }
        record = self.out_dir / FAILED_SHARDS_FILE
        damaged = [unit for unit in self.units if str(unit) in causes and causes[str(unit)].damaged]
        # re-running a unit that read damaged input fails again: its error's fix comes first
        rerun = (
            f"Units {damaged} read damaged input: rebuild it as said below, then re-run only the failed units: "
            f"{retrigger}."
            if damaged
            else f"Re-run only those: {retrigger}."
        )
        # the units' own errors come last: the one line a user reads ends with what is wrong and how
        # to fix it
        why = "".join(f" {stage} {unit}: {cause.message}" for unit, cause in causes.items())
        done = f"{stage} failed for units {self.units} (recorded in {record}); the others are done."
        super().__init__(f"{done} {rerun}{why}")


class UnitsDamaged(UnitsFailed, DataError):
    """Units failed because their input is damaged (a ``DataError``, whatever else ran fine): a data
    error for the exit-code table (2), and a re-run of the stage alone fails again; the message says
    what to rebuild."""


P = TypeVar("P", bound=Plan)


class Stage(ABC, Generic[P]):
    """One pipeline stage. Subclasses set ``name`` and implement plan, run_unit and finalize."""

    name: ClassVar[str]
    unit_name: ClassVar[str] = "unit"  # how the UI names a unit: shard, source, ...
    # how often a failed unit is retried (it resumes) before it counts as failed
    retries: ClassVar[int] = 1
    # plan parameter -> the upstream stage whose directory it takes
    inputs: ClassVar[dict[str, str]] = {}
    # units run on the configured task runner (threads or a Ray cluster)
    scale_out: ClassVar[bool] = False
    # Prefect artifact keys of the finalize table and summary (None: ``<stage>-<unit>s-<fp>`` and
    # ``<stage>-summary-<fp>``); a fixed key is "the latest" one (the gate report, the scaling
    # curve)
    table_key: ClassVar[str | None] = None
    summary_key: ClassVar[str | None] = None
    # whether a successful run records its result for ``recorded_result``; False for a stage whose
    # result is never read back (``reuse_recorded`` always False: plan-night), so running it writes
    # nothing of its own
    records_result: ClassVar[bool] = True

    @abstractmethod
    def plan(self, config: PipelineConfig, **inputs: Any) -> P: ...

    @contextlib.contextmanager
    def resources(self, config: PipelineConfig, plan: P) -> Iterator[Any]:
        yield None

    @abstractmethod
    def run_unit(
        self,
        config: PipelineConfig,
        plan: P,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport: ...

    def unit_output(self, plan: P, unit: Unit) -> Path | None:
        return None

    def unit_imports(self, config: PipelineConfig) -> tuple[str, ...]:
        """What a unit imports on first use from libraries that import lazily, as "module" or
        "module:name": imported once before any unit starts (``import_for_units``), since units
        starting together race for them."""
        return ()

    def max_in_flight(self, config: PipelineConfig) -> int | None:
        """Units running at once (None: as many as the task runner runs)."""
        return None

    def concurrency_limits(self, config: PipelineConfig) -> list[str]:
        """Names of orchestrator-wide concurrency limits a unit holds one slot of while it runs."""
        return []

    def progress(self, plan: P) -> Progress | None:
        return None

    def live_tables(self, plan: P) -> dict[str, LiveTable]:
        """Tables besides the unit board that the stage's watchers see while it runs, by name, read
        from the stage's files like ``progress`` (the online train stage: its producers, trainer and
        store); default: none."""
        return {}

    def health(self, config: PipelineConfig, env: Any) -> list[dict[str, Any]]:
        """The state of the stage's resources while it runs, one dict per server (``url``,
        ``healthy``, ``completed``, ``errors``) for the status a person watches; default: none."""
        return []

    @abstractmethod
    def finalize(
        self, config: PipelineConfig, plan: P, reports: Sequence[UnitReport], failed: Sequence[Unit]
    ) -> StageResult: ...

    def idle(self, plan: P) -> StageResult | None:
        """The result of a plan with nothing to run (capture when the trainer captures its own
        features online): the run ends with it, as with a recorded result: no resources, unit or
        finalize, no file written. Default: None (run the plan)."""
        return None

    def reuse_recorded(self, plan: P) -> bool:
        """Whether a recorded result of this exact plan may stand in for running it
        (``recorded_result``); a plan that asks for the work to be redone (the gate's ``force``)
        says no."""
        return True

    def retrigger(self, plan: P, failed: Sequence[Unit]) -> str:
        """The command that re-runs only the failed units (in ``UnitsFailed``): by default the
        stage's command with the same config, since finished units are skipped."""
        return f"eagle3 {self.name} (same config: finished {self.unit_name}s are skipped)"

    def failed_result(self, plan: P, failed: Sequence[Unit], **fields: Any) -> StageResult:
        """What ``finalize`` returns when units failed: ``failed_shards.json`` written, no
        manifest."""
        write_failed_shards(plan.out_dir, failed)
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=False,
            failed=tuple(failed),
            retrigger=self.retrigger(plan, failed),
            **fields,
        )


def result_path(plan: Plan) -> Path:
    """Where a successful run of ``plan`` records its result: keyed by the whole plan (fingerprint,
    units, inputs), so a night over more shards, or another draft, is another record."""
    return plan.out_dir / stage_result_file(plan.stage, fingerprint(plan.model_dump(mode="json")))


def record_result(stage: Stage[P], plan: P, result: StageResult) -> None:
    """Record a successful run's result (written last, after every output it rests on; always
    rewritten, even when identical, so the record stays newer than the outputs this run wrote),
    unless the stage records none."""
    if stage.records_result and not result.failed:
        with atomic_path(result_path(plan)) as tmp:
            tmp.write_text(result.model_dump_json(indent=2))


def recorded_result(stage: Stage[P], plan: P) -> StageResult | None:
    """The result an earlier run of this exact plan recorded, when nothing it rests on changed
    since: every unit's output (``unit_output``) and the stage manifest exist and none is newer than
    the record. None: run the stage.

    A deleted or rewritten shard, a manifest written by a later, larger run, or a stage that asks to
    redo its work (``reuse_recorded``) all mean None; the stage then runs as usual and skips its
    finished units itself."""
    path = result_path(plan)
    if not stage.reuse_recorded(plan) or not path.is_file():
        return None
    recorded_ns = path.stat().st_mtime_ns
    outputs = [stage.unit_output(plan, unit) for unit in plan.units]
    manifest = plan.out_dir / MANIFEST
    for output in [o for o in outputs if o is not None] + ([manifest] if manifest.exists() else []):
        if not output.exists() or output.stat().st_mtime_ns > recorded_ns:
            return None
    return StageResult.model_validate_json(path.read_text())


def import_for_units(stage: Stage[Any], config: PipelineConfig) -> None:
    """Import ``stage.unit_imports(config)`` on this thread, before the units start on theirs (both
    runners call it).

    transformers resolves its names lazily, importing a submodule at a name's first use, and two
    threads doing that at once in a fresh process fail: one gets ``ImportError: cannot import name
    'AutoTokenizer' from 'transformers'`` while the other still initialises the package (measured: 4
    of 5 fresh two-shard captures, at the template hash each shard starts with; a retry hid it
    unless the retry raced too). Once imported here, the units find every name already resolved."""
    for name in stage.unit_imports(config):
        module, _, attribute = name.partition(":")
        imported = importlib.import_module(module)
        if attribute:
            getattr(imported, attribute)


def run_unit(
    stage: Stage[P], config: PipelineConfig, plan: P, unit: Unit, *, env: Any = None
) -> UnitReport:
    """``stage.run_unit``, unless the run is stopping (``eagle3.runtime.stop``): no unit starts."""
    raise_if_stopped(f"{stage.name} {stage.unit_name} {unit}")
    return stage.run_unit(config, plan, unit, env=env)


def run_stage(stage: Stage[P], config: PipelineConfig, **inputs: Any) -> StageResult:
    """Run a stage in this process without Prefect (``python -m``, benchmarks, tests): the same
    contract the flows drive, ``stage.max_in_flight`` units at a time on threads (one otherwise).
    Inputs are explicit paths; a plan already done (``recorded_result``) is read back, not run.
    SIGINT or SIGTERM stops it (``eagle3.runtime.stop``)."""
    plan = stage.plan(config, **inputs)
    idle = stage.idle(plan)
    if idle is not None:
        logger.info("%s %s: nothing to run", stage.name, plan.fingerprint)
        return idle
    recorded = recorded_result(stage, plan)
    if recorded is not None:
        logger.info(
            "%s %s: done in an earlier run (%s); nothing to do",
            stage.name,
            plan.fingerprint,
            result_path(plan).name,
        )
        return recorded
    reports: list[UnitReport] = []
    failed: list[Unit] = []
    causes: dict[str, UnitFailure] = {}
    import_for_units(stage, config)
    pool = ThreadPoolExecutor(stage.max_in_flight(config) or 1)
    with stop_on_signals(deferred=True), stage.resources(config, plan) as env, pool:
        futures = {pool.submit(run_unit, stage, config, plan, u, env=env): u for u in plan.units}
        running = set(futures)
        while running:
            finished, running = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
            raise_pending_stop()
            for future in finished:
                try:
                    reports.append(future.result())
                except Exception as exc:  # the failure policy: the others go on; finalize records
                    unit = futures[future]
                    logger.exception("%s %s %s failed", stage.name, stage.unit_name, unit)
                    failed.append(unit)
                    causes[str(unit)] = unit_failure(exc)
    result = stage.finalize(config, plan, reports, failed)
    record_result(stage, plan, result)
    return result.raise_for_failed(causes)
