"""The stage contract: every stage of the pipeline has one shape, so one set of Prefect tasks and one library runner
drive them all (DESIGN §1, §3).

::

    plan(config, **inputs) -> Plan          what to do: fingerprint, output directory, units (quick; writes at most
                                            plan.json); ``inputs`` names the upstream directories it takes: the
                                            caller passes explicit paths or lets eagle3.lineage find the config's
    resources(config, plan)                 a context for the units' length (regen: the servers); default: none
    run_unit(config, plan, unit, env, on_progress) -> UnitReport
                                            one unit (a shard, a source, or the stage's single unit); resumable:
                                            a finished unit is skipped cheaply, an interrupted one resumes
    unit_output(plan, unit) -> Path | None  the file whose presence marks the unit done (its Prefect cache key)
    progress(plan) -> Progress | None       work done / planned, read from files (a CLI bar, a Prefect artifact)
    finalize(config, plan, reports, failed) -> StageResult
                                            records failed units (then the caller raises ``UnitsFailed`` with
                                            the re-trigger command); else writes the manifest (the done marker)

A run that succeeds records its result beside its outputs (``record_result``). A later run of the same plan reads
it back (``recorded_result``) while every unit's output and the manifest are unchanged since, and does nothing
else: no resources (regen's reference server), no unit, no finalize, no file written. A finished night costs its
plans, not a server start, a trainer launch or a re-export.

Plans, unit reports and results are frozen pydantic models: JSON on the wire (Prefect task parameters, Ray) and on
disk. The config crosses every boundary as the validated ``PipelineConfig``; a stage never re-reads it.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from eagle3.config import PipelineConfig
from eagle3.errors import DataError
from eagle3.layout import FAILED_SHARDS_FILE, stage_result_file, write_failed_shards
from eagle3.runroot import MANIFEST, atomic_path, fingerprint

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
    units: tuple[Unit, ...] = (0,)  # the units this run executes (shard ids, source names, or the single unit 0)


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
    table: list[dict[str, Any]] = Field(default_factory=list)  # one row per unit, for a table artifact
    markdown: str = ""
    description: str = ""  # a one-line verdict for the artifacts' descriptions (the gate's PASS/FAIL, the curve's)

    def raise_for_failed(self, causes: Mapping[str, str] | None = None) -> StageResult:
        """The one failure policy: a stage with failed units fails, after finalize recorded them (and after the
        caller published the table), with the re-trigger command and each unit's error (``causes``, by
        ``str(unit)``); otherwise returns itself."""
        if self.failed:
            raise UnitsFailed(self.stage, self.out_dir, self.failed, self.retrigger, causes=causes)
        return self


class Progress(Frozen):
    done: int
    total: int
    tokens: int = 0
    unit: str = "samples"


class UnitsFailed(RuntimeError):
    """The one failure policy: the stage ran every other unit, recorded the failed ones (``failed_shards.json``),
    wrote no manifest, and says how to re-run just those."""

    def __init__(
        self, stage: str, out_dir: Path | str, units: Sequence[Unit], retrigger: str, *,
        causes: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.stage, self.out_dir, self.units = stage, Path(out_dir), sorted(set(units), key=str)
        record = self.out_dir / FAILED_SHARDS_FILE
        # the units' own errors come last: the one line a user reads ends with what is wrong and how to fix it
        why = "".join(f" {stage} {unit}: {causes[str(unit)]}" for unit in self.units if str(unit) in (causes or {}))
        super().__init__(f"{stage} failed for units {self.units} (recorded in {record}); the others are done. "
                         f"Re-run only those: {retrigger}.{why}")


P = TypeVar("P", bound=Plan)


class Stage(ABC, Generic[P]):
    """One pipeline stage. Subclasses set ``name`` and implement plan, run_unit and finalize."""

    name: ClassVar[str]
    unit_name: ClassVar[str] = "unit"  # how the UI names a unit: shard, source, ...
    retries: ClassVar[int] = 1  # how often a failed unit is retried (it resumes) before it counts as failed
    inputs: ClassVar[dict[str, str]] = {}  # plan parameter -> the upstream stage whose directory it takes
    scale_out: ClassVar[bool] = False  # units run on the configured task runner (threads or a Ray cluster)
    # Prefect artifact keys of the finalize table and summary (None: ``<stage>-<unit>s-<fp>`` and
    # ``<stage>-summary-<fp>``); a fixed key is "the latest" one (the gate report, the scaling curve)
    table_key: ClassVar[str | None] = None
    summary_key: ClassVar[str | None] = None

    @abstractmethod
    def plan(self, config: PipelineConfig, **inputs: Any) -> P: ...

    @contextlib.contextmanager
    def resources(self, config: PipelineConfig, plan: P) -> Iterator[Any]:
        yield None

    @abstractmethod
    def run_unit(
        self, config: PipelineConfig, plan: P, unit: Unit, *, env: Any = None, on_progress: OnProgress | None = None
    ) -> UnitReport: ...

    def unit_output(self, plan: P, unit: Unit) -> Path | None:
        return None

    def max_in_flight(self, config: PipelineConfig) -> int | None:
        """Units running at once (None: as many as the task runner runs)."""
        return None

    def concurrency_limits(self, config: PipelineConfig) -> list[str]:
        """Names of orchestrator-wide concurrency limits a unit holds one slot of while it runs."""
        return []

    def progress(self, plan: P) -> Progress | None:
        return None

    @abstractmethod
    def finalize(
        self, config: PipelineConfig, plan: P, reports: Sequence[UnitReport], failed: Sequence[Unit]
    ) -> StageResult: ...

    def reuse_recorded(self, plan: P) -> bool:
        """Whether a recorded result of this exact plan may stand in for running it (``recorded_result``); a plan
        that asks for the work to be redone (the gate's ``force``) says no."""
        return True

    def retrigger(self, plan: P, failed: Sequence[Unit]) -> str:
        """The command that re-runs only the failed units (in ``UnitsFailed``): by default the stage's command with
        the same config, since finished units are skipped."""
        return f"eagle3 {self.name} (same config: finished {self.unit_name}s are skipped)"

    def failed_result(self, plan: P, failed: Sequence[Unit], **fields: Any) -> StageResult:
        """What ``finalize`` returns when units failed: ``failed_shards.json`` written, no manifest."""
        write_failed_shards(plan.out_dir, failed)
        return StageResult(stage=self.name, fingerprint=plan.fingerprint, out_dir=plan.out_dir, done=False,
                           failed=tuple(failed), retrigger=self.retrigger(plan, failed), **fields)  # fmt: skip


def result_path(plan: Plan) -> Path:
    """Where a successful run of ``plan`` records its result: keyed by the whole plan (fingerprint, units, inputs),
    so a night over more shards, or another draft, is another record."""
    return plan.out_dir / stage_result_file(plan.stage, fingerprint(plan.model_dump(mode="json")))


def record_result(plan: Plan, result: StageResult) -> None:
    """Record a successful run's result (written last, after every output it rests on; always rewritten, even when
    identical, so the record stays newer than the outputs this run wrote)."""
    if not result.failed:
        with atomic_path(result_path(plan)) as tmp:
            tmp.write_text(result.model_dump_json(indent=2))


def recorded_result(stage: Stage[P], plan: P) -> StageResult | None:
    """The result an earlier run of this exact plan recorded, when nothing it rests on changed since: every unit's
    output (``unit_output``) and the stage manifest exist and none is newer than the record. None: run the stage.

    A deleted or rewritten shard, a manifest written by a later, larger run, or a stage that asks to redo its work
    (``reuse_recorded``) all mean None; the stage then runs as usual and skips its finished units itself."""
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


def run_stage(stage: Stage[P], config: PipelineConfig, **inputs: Any) -> StageResult:
    """Run a stage in this process without Prefect (``python -m``, benchmarks, tests): the same contract the flows
    drive, ``stage.max_in_flight`` units at a time on threads (one otherwise). Inputs are explicit paths; a plan
    already done (``recorded_result``) is read back, not run."""
    plan = stage.plan(config, **inputs)
    recorded = recorded_result(stage, plan)
    if recorded is not None:
        logger.info("%s %s: done in an earlier run (%s); nothing to do", stage.name, plan.fingerprint,
                    result_path(plan).name)  # fmt: skip
        return recorded
    reports: list[UnitReport] = []
    failed: list[Unit] = []
    causes: dict[str, str] = {}
    with stage.resources(config, plan) as env, ThreadPoolExecutor(stage.max_in_flight(config) or 1) as pool:
        futures = {pool.submit(stage.run_unit, config, plan, unit, env=env): unit for unit in plan.units}
        for future in as_completed(futures):
            try:
                reports.append(future.result())
            except Exception as exc:  # the failure policy: the other units go on; finalize records it, then we raise
                logger.exception("%s %s %s failed", stage.name, stage.unit_name, futures[future])
                failed.append(futures[future])
                causes[str(futures[future])] = unit_error(exc)
    result = stage.finalize(config, plan, reports, failed)
    record_result(plan, result)
    return result.raise_for_failed(causes)


def unit_error(exc: BaseException) -> str:
    """A unit's error as it ends the stage's failure line: its type unless it is a ``DataError`` (whose message is
    the whole story), its message's first line."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return first if isinstance(exc, DataError) else f"{type(exc).__name__}: {first}"
