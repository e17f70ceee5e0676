"""The train and export stages (the stage contract of ``eagle3.stage``): one draft directory, one unit each.

``TrainStage`` runs the training workers (``python -m eagle3.train``, under torchrun when ``train.nproc > 1``) in
``<root>/drafts/<draft fingerprint>``; the fingerprint covers the features, the vocab, the result-relevant train
config and the target, so a finished checkpoint there is the finished draft and a re-run skips it without starting a
worker. An interrupted run (a kill, a retry) resumes from ``ckpt/latest``. The workers' output lines go to this
module's logger, which a Prefect run also sends to its logs (``tasks.stage``); progress is read from ``metrics.jsonl``.

``ExportStage`` writes the SGLang directory ``<draft>/export`` from the latest checkpoint (validated before it is
renamed into place); its summary markdown is the model card. Its plan carries a fingerprint of the config fields the
export reads (``export_settings``), so a finished export is read back (``eagle3.stage.recorded_result``) while the
checkpoint, the export and those settings are unchanged, and redone when any of them changed.

A finished night does neither: the train plan's recorded result stands for the trained draft (no worker is
started, not even to find it is at its last step) and the export plan's for the export.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from eagle3.config.pipeline import PipelineConfig
from eagle3.errors import DATA_ERROR_PREFIX, DataError
from eagle3.model.export_format import CARD_FILE, WEIGHTS_FILE
from eagle3.rundir.layout import (
    CKPT_DIR,
    CONFIG_FILE,
    EXPORT_DIR,
    METRICS_FILE,
    VOCAB_FILE,
    stage_dir,
    write_failed_shards,
)
from eagle3.rundir.runroot import Manifest, atomic_write_text, fingerprint
from eagle3.stage import Frozen, OnProgress, Plan, Progress, Stage, StageResult, Unit, UnitReport
from eagle3.train.checkpoint import latest_checkpoint
from eagle3.train.continual import (
    CHAMPION_VOCAB,
    TRAINED_ON,
    Start,
    plan_start,
    record_trained_on,
    write_champion_vocab,
)
from eagle3.train.distributed import run_workers, worker_command
from eagle3.train.export import export_draft
from eagle3.train.metrics import read_metrics
from eagle3.train.trainer import draft_fingerprint

logger = logging.getLogger(__name__)


def vocab_file(vocab: Path | str) -> Path:
    """``vocab.safetensors`` given the file or its vocab stage directory."""
    path = Path(vocab)
    return path / VOCAB_FILE if path.is_dir() else path


class TrainPlan(Plan):
    features_dir: Path
    vocab: Path  # the vocab.safetensors file (a night built on the champion: the champion's, in the draft dir)
    train_samples: int  # rows of the features manifest
    planned_steps: int  # train.max_steps, else an estimate until the trainer's first metrics record gives its count
    start: dict[str, Any] = Field(default_factory=dict)  # ``eagle3.train.continual.Start``: the champion, the rows


class TrainStage(Stage[TrainPlan]):
    """Train the draft on a finished features stage and its vocab (one unit: the whole training run)."""

    name = "train"
    unit_name = "draft"
    retries = 2  # a retry resumes from ckpt/latest, losing at most train.save_every steps
    inputs: ClassVar[dict[str, str]] = {"features_dir": "capture", "vocab": "vocab"}

    def plan(self, config: PipelineConfig, *, features_dir: Path, vocab: Path) -> TrainPlan:
        features, vocab_path = Path(features_dir), vocab_file(vocab)
        start = plan_start(config, features, vocab_name=vocab_path.parent.name)  # a bad champion is refused here
        fp = draft_fingerprint(config, features.name, vocab_path.parent.name, start.identity())
        out_dir = stage_dir(config.root_path, "train", fp)
        manifest = Manifest.read(features)
        samples = manifest.rows if manifest else 0
        if start.champion:
            samples, vocab_path = start.new_rows + len(start.replay_ids), out_dir / CHAMPION_VOCAB
        if start.note:
            logger.warning("train: %s%s", start.note, "" if start.champion else "; this night trains from scratch")
        per_step = config.train.batch_size * config.train.nproc
        planned = config.train.max_steps or config.train.epochs * max(math.ceil(samples / per_step), 1)
        return TrainPlan(stage=self.name, fingerprint=fp, out_dir=out_dir, features_dir=features, vocab=vocab_path,
                         train_samples=samples, planned_steps=planned, start=asdict(start))  # fmt: skip

    def run_unit(
        self, config: PipelineConfig, plan: TrainPlan, unit: Unit, *, env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:  # fmt: skip
        if _trained(plan.out_dir):
            logger.info("draft %s is already trained (%s)", plan.fingerprint, plan.out_dir / CKPT_DIR)
            return UnitReport(unit=unit, skipped=True, rows=plan.train_samples)
        config_yaml = prepare_draft_dir(config, plan)
        command = worker_command(config_yaml, plan.features_dir, plan.vocab, plan.out_dir, nproc=config.train.nproc)
        logger.info("starting: %s", " ".join(command))
        data_errors: list[str] = []

        def on_line(line: str) -> None:
            logger.info("%s", line)
            if DATA_ERROR_PREFIX in line:  # torchrun may prefix worker lines with their rank
                data_errors.append(line.split(DATA_ERROR_PREFIX, 1)[1])

        code = run_workers(command, on_line)
        if code != 0 and data_errors:
            raise DataError(data_errors[0])  # not retried: the same data fails the same way
        if code != 0:
            raise RuntimeError(f"training exited with code {code}; a retry resumes from {plan.out_dir / CKPT_DIR}")
        last = _last_metrics(plan.out_dir)
        return UnitReport(unit=unit, rows=plan.train_samples, tokens=int(last.get("tokens", 0)),
                          detail={"steps": last.get("step")})  # fmt: skip

    def unit_output(self, plan: TrainPlan, unit: Unit) -> Path:
        return plan.out_dir / CKPT_DIR / "latest"

    def progress(self, plan: TrainPlan) -> Progress:
        """Optimizer steps done / total from ``metrics.jsonl`` (written by rank 0, readable from any process)."""
        last = _last_metrics(plan.out_dir)
        return Progress(done=int(last.get("step", 0)), total=int(last.get("total_steps", plan.planned_steps)),
                        tokens=int(last.get("tokens", 0)), unit="steps")  # fmt: skip

    def retrigger(self, plan: TrainPlan, failed: Sequence[Unit]) -> str:
        return f"eagle3 train --features {plan.features_dir} --vocab {plan.vocab}"

    def finalize(
        self, config: PipelineConfig, plan: TrainPlan, reports: Sequence[UnitReport], failed: Sequence[Unit]
    ) -> StageResult:
        last = _last_metrics(plan.out_dir)
        summary = {"out_dir": str(plan.out_dir), "steps": last.get("step"), "final": last,
                   "features_dir": str(plan.features_dir), "vocab": str(plan.vocab),
                   "train_samples": plan.train_samples, "start": Start(**plan.start).summary()}  # fmt: skip
        if failed:
            return self.failed_result(plan, failed, summary=summary)
        write_failed_shards(plan.out_dir, [])
        return StageResult(stage=self.name, fingerprint=plan.fingerprint, out_dir=plan.out_dir, done=True,
                           summary=summary)  # fmt: skip


def prepare_draft_dir(config: PipelineConfig, plan: TrainPlan) -> Path:
    """What the workers read besides the features: the start (``start.json``; a champion night also gets the
    champion's vocab maps), the data record ``trained_on.json`` and the resolved config; returns the config path."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    start = Start(**plan.start)
    if start.champion:
        write_champion_vocab(start, plan.vocab)
    start.write(plan.out_dir)
    record_trained_on(config, plan.features_dir, plan.out_dir)
    config_yaml = plan.out_dir / CONFIG_FILE
    atomic_write_text(config_yaml, config.to_yaml())
    return config_yaml


def _last_metrics(out_dir: Path) -> dict[str, Any]:
    records = read_metrics(out_dir / METRICS_FILE)
    return records[-1] if records else {}


def _trained(out_dir: Path) -> bool:
    """Whether ``ckpt/latest`` is the trainer's last step (the fingerprint fixes the step count)."""
    latest = latest_checkpoint(out_dir / CKPT_DIR)
    if latest is None:
        return False
    state = json.loads((latest / "trainer.json").read_text())
    return int(state["step"]) >= int(state["total_steps"])


class ExportPlan(Plan):
    features_dir: Path  # its manifest gives the layer ids the draft was trained on
    vocab: Path  # the vocab.safetensors file
    settings: str  # fingerprint of the config fields the export reads: another value is another export plan

    @property
    def export_dir(self) -> Path:
        return self.out_dir / EXPORT_DIR


def export_settings(config: PipelineConfig) -> str:
    """The config fields ``export_draft`` reads beyond the checkpoint (dtype, served context, the model card's
    target and sources, the Hub repo), as one fingerprint."""
    return fingerprint(config.export.model_dump(mode="json"), config.train.precision, config.server.context_length,
                       config.target.model_dump(mode="json"), [s.model_dump(mode="json") for s in config.sources],
                       config.mix.total)  # fmt: skip


class ExportStage(Stage[ExportPlan]):
    """Export a trained draft directory (the train stage's ``out_dir``) for SGLang (one unit)."""

    name = "export"
    unit_name = "draft"
    retries = 1
    inputs: ClassVar[dict[str, str]] = {"features_dir": "capture", "vocab": "vocab"}

    def plan(self, config: PipelineConfig, *, draft_dir: Path, vocab: Path, features_dir: Path) -> ExportPlan:
        draft = Path(draft_dir)
        return ExportPlan(stage=self.name, fingerprint=draft.name, out_dir=draft, features_dir=Path(features_dir),
                          vocab=vocab_file(vocab), settings=export_settings(config))  # fmt: skip

    def run_unit(
        self, config: PipelineConfig, plan: ExportPlan, unit: Unit, *, env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:  # fmt: skip
        export = export_draft(config, plan.out_dir, plan.vocab, plan.features_dir, plan.export_dir)
        if (plan.out_dir / TRAINED_ON).exists():  # the data record travels with the export into the registry
            atomic_write_text(export / TRAINED_ON, (plan.out_dir / TRAINED_ON).read_text())
        logger.info("draft exported to %s", export)
        return UnitReport(unit=unit, detail={"export": str(export)})

    def unit_output(self, plan: ExportPlan, unit: Unit) -> Path:
        return plan.export_dir / WEIGHTS_FILE

    def retrigger(self, plan: ExportPlan, failed: Sequence[Unit]) -> str:
        return (f"eagle3 export --draft-dir {plan.out_dir} --out {plan.export_dir} --vocab {plan.vocab} "
                f"--features {plan.features_dir}")  # fmt: skip

    def finalize(
        self, config: PipelineConfig, plan: ExportPlan, reports: Sequence[UnitReport], failed: Sequence[Unit]
    ) -> StageResult:
        if failed:
            return self.failed_result(plan, failed)
        write_failed_shards(plan.out_dir, [])
        return StageResult(stage=self.name, fingerprint=plan.fingerprint, out_dir=plan.out_dir, done=True,
                           summary={"export": str(plan.export_dir)},
                           markdown=(plan.export_dir / CARD_FILE).read_text())  # fmt: skip


class TrainedDraft(Frozen):
    """A trained and exported draft, what the train flows return: its fingerprint and directory, the vocab and
    features it trained on, the training-sample count, the export directory, how it started (scratch or built on
    the champion: ``eagle3.train.continual``) and the train stage's summary."""

    fingerprint: str
    out_dir: str
    vocab: str
    features_dir: str | None = None
    train_samples: int
    start: dict[str, Any] = Field(default_factory=dict)
    summary: dict[str, Any] = Field(default_factory=dict)
    export: str | None = None  # set once exported (``exported``)

    @classmethod
    def of(cls, train: StageResult) -> TrainedDraft:
        """The draft a finished train stage result describes (not yet exported)."""
        s = train.summary
        return cls(fingerprint=train.fingerprint, out_dir=str(train.out_dir), vocab=s["vocab"],
                   features_dir=s.get("features_dir"), train_samples=s["train_samples"], start=s.get("start", {}),
                   summary=s)  # fmt: skip

    def exported(self, export: StageResult) -> TrainedDraft:
        return self.model_copy(update={"export": export.summary["export"]})
