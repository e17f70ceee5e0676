"""The capture stage (the stage contract of ``eagle3.stage``): regen shards -> feature shards, one
unit per shard.

The caller names the regen stage (``eagle3.lineage`` finds the one the config names). A regen shard
is ready when its final ``shard-NNNNN.parquet`` validates; shards not ready (still running, or
failed and listed for re-trigger) are reported as ``missing`` and skipped, so a night's capture
takes what regen finished. The features directory is ``<root>/features/<features_fingerprint(config,
regen_fp)>``: one per regen stage, so a nightly run over a grown prompt set adds shards to it
instead of recapturing old ones.

Its plan decides where the trainer's hidden states come from (``train.features``; ``auto`` by the
disk budget, ``eagle3.capture.costs``), once a night, with the reason: the ``FeatureSource`` the
vocab, train and export stages plan with. ``online`` captures nothing here: the plan has no unit and
its result is that decision (``CaptureStage.idle``), no file written; the trainer's producers
capture the regen shards during training.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from eagle3.capture.budget import capture_estimate, check_disk_budget
from eagle3.capture.costs import choose_features
from eagle3.capture.manifest import finalize_features
from eagle3.capture.shard import (
    REGEN_INPUT_SCHEMA,
    capture_shard,
    features_fingerprint,
    output_paths,
    regen_shards,
    shard_index_of,
)
from eagle3.config.pipeline import PipelineConfig
from eagle3.data.parquet import ShardError, open_shard, shard_is_valid
from eagle3.rundir.layout import SHARD_GLOB, feature_set_fingerprint, stage_dir, write_failed_shards
from eagle3.rundir.runroot import fingerprint, sweep_removed
from eagle3.stage import Frozen, OnProgress, Plan, Progress, Stage, StageResult, Unit, UnitReport
from eagle3.target_io import tokenizer_imports

logger = logging.getLogger(__name__)


def features_dir_for(config: PipelineConfig, regen_dir: Path) -> Path:
    """``<root>/features/<fp>``: the features stage of this config over a regen stage (one per regen
    stage)."""
    return stage_dir(
        config.root_path, "capture", features_fingerprint(config, Path(regen_dir).name)
    )


class FeatureSource(Frozen):
    """Where the trainer's hidden states come from, decided once (``feature_source``) and handed to
    every stage that trains on them: ``stored`` feature shards in ``features_dir``, or ``online``:
    producers capture the regen shards of ``regen_dir`` during training, and ``features_dir`` (never
    written) names the features stage their batches stand for, so a draft trained either way has one
    fingerprint."""

    mode: Literal["stored", "online"]
    why: str  # the decision's reason: the log, the train stage's summary, the night summary
    features_dir: Path
    regen_dir: Path | None = None  # the regen stage the features are (or would be) captured from

    @classmethod
    def stored(cls, features_dir: Path | str) -> FeatureSource:
        """A finished features stage given by its directory."""
        why = f"stored features {features_dir}"
        return cls(mode="stored", why=why, features_dir=Path(features_dir))

    @classmethod
    def of(cls, capture: StageResult) -> FeatureSource:
        """The decision a capture stage's result records."""
        return cls.model_validate(capture.summary["features"])

    @property
    def online(self) -> bool:
        return self.mode == "online"

    @property
    def shards_dir(self) -> str | None:
        """The stored feature shards' directory (what the export and the gate's offline check read);
        None online."""
        return None if self.online else str(self.features_dir)

    def samples_fingerprint(self) -> str:
        """Identity of the samples trained on (the vocab's key): the shards the features manifest
        lists (nights add shards to one features directory), or online the regen shards by name and
        size (a rebuilt one is another set)."""
        if not self.online:
            return feature_set_fingerprint(self.features_dir)
        assert self.regen_dir is not None
        shards = [(p.name, p.stat().st_size) for p in regen_shards(self.regen_dir)]
        return fingerprint("online-regen", self.regen_dir.name, shards)


def feature_source(config: PipelineConfig, regen_dir: Path) -> FeatureSource:
    """``train.features`` decided for the regen stage ``regen_dir`` (``auto``: by the disk budget
    against the tokens its shards hold that are not captured yet, ``eagle3.capture.costs``), with
    the features stage it names."""
    choice = choose_features(config, regen_dir=Path(regen_dir))
    return FeatureSource(
        mode=choice.mode,
        why=choice.why,
        features_dir=features_dir_for(config, regen_dir),
        regen_dir=Path(regen_dir),
    )


def capture_progress(
    regen_dir: Path, features_dir: Path, *, shard_ids: Sequence[int] | None = None
) -> Progress:
    """Samples done / planned over the finished regen shards (or only ``shard_ids``), read from
    files on disk (safe from another process while a flow runs, and without its plan): a finished
    feature shard counts all its regen rows, a running one the rows of its finished part files; a
    regen shard that does not open yet is not counted (the plan skips it as not ready too)."""
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
    features: FeatureSource  # the night's decision: online plans no unit


class CaptureStage(Stage[CapturePlan]):
    name = "capture"
    unit_name = "shard"
    scale_out = True
    inputs: ClassVar[dict[str, str]] = {"regen_dir": "regen"}

    def plan(
        self, config: PipelineConfig, *, regen_dir: Path, shard_ids: Sequence[int] | None = None
    ) -> CapturePlan:
        regen = Path(regen_dir)
        features = feature_source(config, regen)
        logger.info("%s", features.why)
        if features.online:
            out = features.features_dir
            return CapturePlan(
                stage=self.name,
                fingerprint=out.name,
                out_dir=out,
                units=(),
                regen_dir=regen,
                shards={},
                features=features,
            )
        present = {shard_index_of(p): p for p in sorted(regen.glob(SHARD_GLOB))}
        wanted = sorted(set(shard_ids)) if shard_ids is not None else sorted(present)
        ready = {
            i: present[i]
            for i in wanted
            if i in present and shard_is_valid(present[i], schema=REGEN_INPUT_SCHEMA)
        }
        missing = tuple(i for i in wanted if i not in ready)
        if missing:
            logger.warning(
                "regen shards %s are not finished in %s; capturing the %d that are",
                missing,
                regen,
                len(ready),
            )
        out = features.features_dir
        return CapturePlan(
            stage=self.name,
            fingerprint=out.name,
            out_dir=out,
            units=tuple(ready),
            regen_dir=regen,
            shards=ready,
            missing=missing,
            features=features,
        )

    def idle(self, plan: CapturePlan) -> StageResult | None:
        """Online: nothing to capture, the result is the decision (no directory is written)."""
        if not plan.features.online:
            return None
        decision = {"features": plan.features.model_dump(mode="json")}
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=False,
            summary=decision,
        )

    @contextlib.contextmanager
    def resources(self, config: PipelineConfig, plan: CapturePlan) -> Iterator[None]:
        """The disk budget, checked once before any unit writes (``eagle3.capture.budget``): shards
        already finished need nothing more. Part files a killed run left half-deleted are deleted
        first (the budget then counts the space they held)."""
        sweep_removed(plan.out_dir)
        todo = [path for i, path in plan.shards.items() if not self.unit_output(plan, i).exists()]
        if todo:
            check_disk_budget(
                capture_estimate(config, todo),
                plan.out_dir,
                reserve_bytes=config.capture.disk_reserve_bytes,
                encoding=config.capture.encoding,
            )
        yield None

    def max_in_flight(self, config: PipelineConfig) -> int | None:
        return config.capture.shards_in_flight

    def unit_imports(self, config: PipelineConfig) -> tuple[str, ...]:
        """Each shard's footer hashes the target tokenizer's chat template; the hf backend loads
        the model (once, shared)."""
        return *tokenizer_imports(config.target), "transformers:AutoModelForCausalLM"

    def run_unit(
        self,
        config: PipelineConfig,
        plan: CapturePlan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:
        report = (
            None
            if on_progress is None
            else (lambda done, _total, tokens: on_progress(done, tokens))
        )
        result = capture_shard(config, plan.shards[int(unit)], plan.out_dir, progress=report)
        detail = {"quarantined": result["quarantined"]}
        return UnitReport(
            unit=unit,
            skipped=result["skipped"],
            rows=result["rows"],
            tokens=result.get("tokens", 0),
            detail=detail,
        )

    def unit_output(self, plan: CapturePlan, unit: Unit) -> Path:
        return output_paths(plan.out_dir, int(unit))[0]

    def progress(self, plan: CapturePlan) -> Progress:
        return capture_progress(
            plan.regen_dir, plan.out_dir, shard_ids=[int(u) for u in plan.units]
        )

    def retrigger(self, plan: CapturePlan, failed: Sequence[Unit]) -> str:
        return f"eagle3 capture --regen-dir {plan.regen_dir} " + " ".join(
            f"--shard {u}" for u in failed
        )

    def finalize(
        self,
        config: PipelineConfig,
        plan: CapturePlan,
        reports: Sequence[UnitReport],
        failed: Sequence[Unit],
    ) -> StageResult:
        table = [
            {
                "shard": r.unit,
                "rows": r.rows,
                "quarantined": r.detail.get("quarantined", 0),
                "state": "skipped (done)" if r.skipped else "captured",
            }
            for r in reports
        ]
        table += [{"shard": u, "rows": 0, "quarantined": 0, "state": "failed"} for u in failed]
        fields: dict[str, Any] = {
            "summary": {
                "shards": len(reports),
                "missing": list(plan.missing),
                "features": plan.features.model_dump(mode="json"),
            },
            "table": sorted(table, key=lambda r: r["shard"]),
            "markdown": f"# capture {plan.fingerprint}\n\n- features: `{plan.out_dir}`\n- shards captured: "
            f"{len(reports)}, failed: {list(failed) or 'none'}, not ready in regen: {list(plan.missing) or 'none'}\n",
        }
        if failed:
            return self.failed_result(plan, failed, **fields)
        write_failed_shards(plan.out_dir, [])
        manifest = finalize_features(config, plan.out_dir, [int(r.unit) for r in reports])
        logger.info("features manifest %s", manifest)
        return StageResult(
            stage=self.name, fingerprint=plan.fingerprint, out_dir=plan.out_dir, done=True, **fields
        )
