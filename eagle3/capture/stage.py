"""The capture stage (the stage contract of ``eagle3.stage``): regen shards -> feature shards, one unit per shard.

The caller names the regen stage (``eagle3.lineage`` finds the one the config names). A regen shard is ready when
its final ``shard-NNNNN.parquet`` validates; shards not ready (still running, or failed and listed for re-trigger)
are reported as ``missing`` and skipped, so a night's capture takes what regen finished. The features directory is
``<root>/features/<features_fingerprint(config, regen_fp)>``: one per regen stage, so a nightly run over a grown
prompt set adds shards to it instead of recapturing old ones.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from eagle3.capture.budget import capture_estimate, check_disk_budget
from eagle3.capture.shard import (
    REGEN_INPUT_SCHEMA,
    capture_shard,
    features_fingerprint,
    finalize_features,
    output_paths,
    shard_index_of,
)
from eagle3.config.pipeline import PipelineConfig
from eagle3.data.parquet import ShardError, open_shard, shard_is_valid
from eagle3.rundir.layout import SHARD_GLOB, stage_dir, write_failed_shards
from eagle3.rundir.runroot import sweep_removed
from eagle3.stage import OnProgress, Plan, Progress, Stage, StageResult, Unit, UnitReport
from eagle3.target_io import tokenizer_imports

logger = logging.getLogger(__name__)


def features_dir_for(config: PipelineConfig, regen_dir: Path) -> Path:
    """``<root>/features/<fp>``: the features stage of this config over a regen stage (one per regen stage)."""
    return stage_dir(config.root_path, "capture", features_fingerprint(config, Path(regen_dir).name))


def capture_progress(regen_dir: Path, features_dir: Path, *, shard_ids: Sequence[int] | None = None) -> Progress:
    """Samples done / planned over the finished regen shards (or only ``shard_ids``), read from files on disk
    (safe from another process while a flow runs, and without its plan): a finished feature shard counts all its
    regen rows, a running one the rows of its finished part files; a regen shard that does not open yet is not
    counted (the plan skips it as not ready too)."""
    wanted = None if shard_ids is None else set(shard_ids)
    done = total = 0
    for regen_shard in sorted(Path(regen_dir).glob(SHARD_GLOB)):
        index = shard_index_of(regen_shard)
        if wanted is not None and index not in wanted:
            continue
        try:
            rows = open_shard(regen_shard).metadata.num_rows
        except (ShardError, FileNotFoundError):
            continue
        total += rows
        shard, _, parts = output_paths(Path(features_dir), index)
        if shard.exists():
            done += rows
            continue
        for part in parts.glob("*.part-*.parquet") if parts.exists() else []:
            try:
                done += open_shard(part).metadata.num_rows
            except (ShardError, FileNotFoundError):
                continue  # removed by the merge between listing and opening
    return Progress(done=done, total=total)


class CapturePlan(Plan):
    regen_dir: Path
    shards: dict[int, Path]  # ready shard index -> its regen shard
    missing: tuple[int, ...] = ()  # asked for, but not finished in the regen stage


class CaptureStage(Stage[CapturePlan]):
    name = "capture"
    unit_name = "shard"
    scale_out = True
    inputs: ClassVar[dict[str, str]] = {"regen_dir": "regen"}

    def plan(self, config: PipelineConfig, *, regen_dir: Path, shard_ids: Sequence[int] | None = None) -> CapturePlan:
        regen = Path(regen_dir)
        present = {shard_index_of(p): p for p in sorted(regen.glob(SHARD_GLOB))}
        wanted = sorted(set(shard_ids)) if shard_ids is not None else sorted(present)
        ready = {i: present[i] for i in wanted if i in present and shard_is_valid(present[i],
                                                                                   schema=REGEN_INPUT_SCHEMA)}
        missing = tuple(i for i in wanted if i not in ready)
        if missing:
            logger.warning("regen shards %s are not finished in %s; capturing the %d that are", missing, regen,
                           len(ready))
        out = features_dir_for(config, regen)
        return CapturePlan(stage=self.name, fingerprint=out.name, out_dir=out, units=tuple(ready), regen_dir=regen,
                           shards=ready, missing=missing)  # fmt: skip

    @contextlib.contextmanager
    def resources(self, config: PipelineConfig, plan: CapturePlan) -> Iterator[None]:
        """The disk budget, checked once before any unit writes (``eagle3.capture.budget``): shards already
        finished need nothing more. Part files a killed run left half-deleted are deleted first (the budget then
        counts the space they held)."""
        sweep_removed(plan.out_dir)
        todo = [path for i, path in plan.shards.items() if not self.unit_output(plan, i).exists()]
        if todo:
            check_disk_budget(capture_estimate(config, todo), plan.out_dir,
                              reserve_bytes=config.capture.disk_reserve_bytes, encoding=config.capture.encoding)
        yield None

    def max_in_flight(self, config: PipelineConfig) -> int | None:
        return config.capture.shards_in_flight

    def unit_imports(self, config: PipelineConfig) -> tuple[str, ...]:
        """Each shard's footer hashes the target tokenizer's chat template; the hf backend loads
        the model (once, shared)."""
        return *tokenizer_imports(config.target), "transformers:AutoModelForCausalLM"

    def run_unit(
        self, config: PipelineConfig, plan: CapturePlan, unit: Unit, *, env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:  # fmt: skip
        report = None if on_progress is None else (lambda done, _total, tokens: on_progress(done, tokens))
        result = capture_shard(config, plan.shards[int(unit)], plan.out_dir, progress=report)
        detail = {"quarantined": result["quarantined"]}
        return UnitReport(unit=unit, skipped=result["skipped"], rows=result["rows"], tokens=result.get("tokens", 0),
                          detail=detail)

    def unit_output(self, plan: CapturePlan, unit: Unit) -> Path:
        return output_paths(plan.out_dir, int(unit))[0]

    def progress(self, plan: CapturePlan) -> Progress:
        return capture_progress(plan.regen_dir, plan.out_dir, shard_ids=[int(u) for u in plan.units])

    def retrigger(self, plan: CapturePlan, failed: Sequence[Unit]) -> str:
        return f"eagle3 capture --regen-dir {plan.regen_dir} " + " ".join(f"--shard {u}" for u in failed)

    def finalize(
        self, config: PipelineConfig, plan: CapturePlan, reports: Sequence[UnitReport], failed: Sequence[Unit]
    ) -> StageResult:
        table = [{"shard": r.unit, "rows": r.rows, "quarantined": r.detail.get("quarantined", 0),
                  "state": "skipped (done)" if r.skipped else "captured"} for r in reports]
        table += [{"shard": u, "rows": 0, "quarantined": 0, "state": "failed"} for u in failed]
        fields: dict[str, Any] = {
            "summary": {"shards": len(reports), "missing": list(plan.missing)},
            "table": sorted(table, key=lambda r: r["shard"]),
            "markdown": f"# capture {plan.fingerprint}\n\n- features: `{plan.out_dir}`\n- shards captured: "
            f"{len(reports)}, failed: {list(failed) or 'none'}, not ready in regen: {list(plan.missing) or 'none'}\n",
        }
        if failed:
            return self.failed_result(plan, failed, **fields)
        write_failed_shards(plan.out_dir, [])
        manifest = finalize_features(config, plan.out_dir, [int(r.unit) for r in reports])
        logger.info("features manifest %s", manifest)
        return StageResult(stage=self.name, fingerprint=plan.fingerprint, out_dir=plan.out_dir, done=True, **fields)
