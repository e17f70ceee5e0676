"""The train and export stages (the stage contract of ``eagle3.stage``): one draft, one unit each.

Both serve stored and online features alike.

``TrainStage`` plans with the night's ``FeatureSource`` (``train.features``, decided once by the
capture stage's plan, with its reason): stored feature shards, or online, where producers capture
the regen shards during training. Either way its one unit runs the training workers
(``eagle3.train.workers``: ``python -m eagle3.train``, under torchrun when ``train.nproc > 1``) in
``<root>/drafts/<draft fingerprint>``; what differs is the feed around them: nothing for stored
shards, the broker and the producer actors for online ones (``eagle3.train.online.run``). The
fingerprint covers the features stage (the one the online batches stand for), the vocab, the
result-relevant train config and the target, not how the states reached the trainer: a finished
checkpoint there is the finished draft, and a re-run skips it without starting a worker. An
interrupted run (a kill, a retry) resumes from ``ckpt/latest``. The workers' output lines go to this
module's loggers, which a Prefect run also sends to its logs (``tasks.stage``); progress is read
from ``metrics.jsonl`` (online, with the producers' ``online-status.json``).

``ExportStage`` writes the SGLang directory ``<draft>/export`` from the latest checkpoint (validated
before it is renamed into place); its summary markdown is the model card. The layer ids are the
features manifest's (stored) or the config's (online: the ones the producers captured, checked on
every batch through the features fingerprint). Its plan carries a fingerprint of the config fields
the export reads (``export_settings``), so a finished export is read back
(``eagle3.stage.recorded_result``) while the checkpoint, the export and those settings are
unchanged, and redone when any of them changed.

A finished night does neither: the train plan's recorded result stands for the trained draft (no
worker is started, not even to find it is at its last step) and the export plan's for the export.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from eagle3.capture.stage import FeatureSource
from eagle3.config.pipeline import PipelineConfig
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
from eagle3.stage import (
    Frozen,
    LiveTable,
    OnProgress,
    Plan,
    Progress,
    Stage,
    StageResult,
    Unit,
    UnitReport,
)
from eagle3.train.checkpoint import latest_checkpoint
from eagle3.train.continual import (
    CHAMPION_VOCAB,
    TRAINED_ON,
    Start,
    plan_start,
    record_trained_on,
    write_champion_vocab,
)
from eagle3.train.export import export_draft
from eagle3.train.identity import draft_fingerprint
from eagle3.train.metrics import read_metrics
from eagle3.train.online.status import producer_table, read_online_status, status_note
from eagle3.train.workers import Feed, run_training, stored_args, worker_command

logger = logging.getLogger(__name__)


def vocab_file(vocab: Path | str) -> Path:
    """``vocab.safetensors`` given the file or its vocab stage directory."""
    path = Path(vocab)
    return path / VOCAB_FILE if path.is_dir() else path


class TrainPlan(Plan):
    features: FeatureSource  # where the hidden states come from, and why
    vocab: (
        Path  # vocab.safetensors (a night built on the champion: the champion's, in the draft dir)
    )
    train_samples: int  # samples per epoch (a champion night: its new and replayed rows)
    planned_steps: int  # train.max_steps, else estimated until the first metrics record counts them
    start: dict[str, Any] = Field(
        default_factory=dict
    )  # ``continual.Start``: the champion, the rows


def _planned_size(config: PipelineConfig, features: FeatureSource, start: Start) -> tuple[int, int]:
    """(samples per epoch, optimizer steps) the run is planned for: the online plan's batches, else
    the features manifest's rows (a champion night: its new and replayed rows) over the global
    batch."""
    train = config.train
    if features.online:
        from eagle3.train.online.plan import OnlinePlan

        assert features.regen_dir is not None
        online = OnlinePlan.for_night(config, features.regen_dir, world_size=train.nproc)
        samples, per_epoch = sum(len(g) for g in online.groups), online.steps_per_epoch
    else:
        manifest = Manifest.read(features.features_dir)
        samples = manifest.rows if manifest else 0
        samples = start.new_rows + len(start.replay_ids) if start.champion else samples
        per_epoch = math.ceil(samples / (train.batch_size * train.nproc))
    return samples, train.max_steps or train.epochs * max(per_epoch, 1)


class TrainStage(Stage[TrainPlan]):
    """Train the draft on a feature source and its vocab (one unit: the whole training run)."""

    name = "train"
    unit_name = "draft"
    retries = 2  # a retry resumes from ckpt/latest, losing at most train.save_every steps
    inputs: ClassVar[dict[str, str]] = {"features": "features", "vocab": "vocab"}

    def plan(self, config: PipelineConfig, *, features: FeatureSource, vocab: Path) -> TrainPlan:
        vocab_path = vocab_file(vocab)
        start = (
            Start()
        )  # online features keep no shard a champion has seen (the config refuses both)
        if not features.online:  # a bad champion is refused here
            start = plan_start(config, features.features_dir, vocab_name=vocab_path.parent.name)
        fp = draft_fingerprint(
            config, features.features_dir.name, vocab_path.parent.name, start.identity()
        )
        out_dir = stage_dir(config.root_path, "train", fp)
        if start.champion:
            vocab_path = out_dir / CHAMPION_VOCAB
        if start.note:
            scratch = "" if start.champion else "; this night trains from scratch"
            logger.warning("train: %s%s", start.note, scratch)
        samples, planned = _planned_size(config, features, start)
        return TrainPlan(
            stage=self.name,
            fingerprint=fp,
            out_dir=out_dir,
            features=features,
            vocab=vocab_path,
            train_samples=samples,
            planned_steps=planned,
            start=asdict(start),
        )

    def run_unit(
        self,
        config: PipelineConfig,
        plan: TrainPlan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:
        if _trained(plan.out_dir):
            logger.info(
                "draft %s is already trained (%s)", plan.fingerprint, plan.out_dir / CKPT_DIR
            )
            return UnitReport(unit=unit, skipped=True, rows=plan.train_samples)
        logger.info("%s", plan.features.why)
        config_yaml = prepare_draft_dir(config, plan)
        with _feed(config, plan) as feed:
            command = worker_command(
                config_yaml, plan.vocab, plan.out_dir, feed.args, nproc=config.train.nproc
            )
            workers = run_training(command, log=logger)
        resume = f"a retry resumes from {plan.out_dir / CKPT_DIR}"
        workers.raise_for_failure(
            f"{feed.name} exited with code {workers.code}; {resume}{feed.note}"
        )
        last = _last_metrics(plan.out_dir)
        return UnitReport(
            unit=unit,
            rows=plan.train_samples,
            tokens=int(last.get("tokens", 0)),
            detail={"steps": last.get("step"), **feed.detail},
        )

    def unit_output(self, plan: TrainPlan, unit: Unit) -> Path:
        return plan.out_dir / CKPT_DIR / "latest"

    def progress(self, plan: TrainPlan) -> Progress:
        """Optimizer steps done / total from ``metrics.jsonl`` (written by rank 0, readable from any
        process); online, noted with the store's backlog, the trainer's samples/s and the producers
        (``online-status.json``)."""
        last = _last_metrics(plan.out_dir)
        progress = Progress(
            done=int(last.get("step", 0)),
            total=int(last.get("total_steps", plan.planned_steps)),
            tokens=int(last.get("tokens", 0)),
            unit="steps",
        )
        status = read_online_status(plan.out_dir) if plan.features.online else None
        if status is not None:
            progress = progress.model_copy(update={"note": status_note(status)})
        return progress

    def live_tables(self, plan: TrainPlan) -> dict[str, LiveTable]:
        """Online: ``producers``, one row per producer (state, batches, rate, restarts, last error),
        the trainer and the store."""
        status = read_online_status(plan.out_dir) if plan.features.online else None
        return {} if status is None else {"producers": producer_table(status)}

    def retrigger(self, plan: TrainPlan, failed: Sequence[Unit]) -> str:
        if plan.features.online:
            where = f"regen {plan.features.regen_dir}, vocab {plan.vocab}"
            return f"eagle3 train --set train.features=online  # {where}"
        return f"eagle3 train --features {plan.features.features_dir} --vocab {plan.vocab}"

    def finalize(
        self,
        config: PipelineConfig,
        plan: TrainPlan,
        reports: Sequence[UnitReport],
        failed: Sequence[Unit],
    ) -> StageResult:
        last = _last_metrics(plan.out_dir)
        store = next((r.detail["store"] for r in reports if r.detail.get("store")), None)
        summary = {
            "out_dir": str(plan.out_dir),
            "steps": last.get("step"),
            "final": last,
            "features_dir": str(plan.features.features_dir),
            "vocab": str(plan.vocab),
            "train_samples": plan.train_samples,
            "start": Start(**plan.start).summary(),
            "features": plan.features.mode,
            "features_decision": plan.features.why,
            "regen_dir": str(plan.features.regen_dir) if plan.features.regen_dir else None,
            "store": store,
        }
        if failed:
            return self.failed_result(plan, failed, summary=summary)
        write_failed_shards(plan.out_dir, [])
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=True,
            summary=summary,
        )


@contextmanager
def _feed(config: PipelineConfig, plan: TrainPlan) -> Iterator[Feed]:
    """How the batches reach the unit's workers: the stored shards they read, or the online run's
    broker and producers for the length of the block."""
    if not plan.features.online:
        yield Feed(args=stored_args(plan.features.features_dir))
        return
    from eagle3.train.online.run import online_feed

    assert plan.features.regen_dir is not None
    with online_feed(config, plan.features.regen_dir, plan.out_dir) as feed:
        yield feed


def prepare_draft_dir(config: PipelineConfig, plan: TrainPlan) -> Path:
    """What the workers read besides the batches: the start (``start.json``; a champion night also
    gets the champion's vocab maps), the data record ``trained_on.json`` (stored features) and the
    resolved config; returns the config path."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    start = Start(**plan.start)
    if start.champion:
        write_champion_vocab(start, plan.vocab)
    if not plan.features.online:
        start.write(plan.out_dir)
        record_trained_on(config, plan.features.features_dir, plan.out_dir)
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
    features: FeatureSource  # stored: its manifest gives the layer ids the draft was trained on
    vocab: Path  # the vocab.safetensors file
    # fingerprint of the config fields the export reads: another value is another export plan
    settings: str

    @property
    def export_dir(self) -> Path:
        return self.out_dir / EXPORT_DIR


def export_settings(config: PipelineConfig) -> str:
    """The config fields ``export_draft`` reads beyond the checkpoint (dtype, served context, the
    model card's target and sources, the Hub repo), as one fingerprint."""
    return fingerprint(
        config.export.model_dump(mode="json"),
        config.train.precision,
        config.server.context_length,
        config.target.model_dump(mode="json"),
        [s.model_dump(mode="json") for s in config.sources],
        config.mix.total,
    )


class ExportStage(Stage[ExportPlan]):
    """Export a trained draft directory (the train stage's ``out_dir``) for SGLang (one unit)."""

    name = "export"
    unit_name = "draft"
    retries = 1
    inputs: ClassVar[dict[str, str]] = {"features": "features", "vocab": "vocab"}

    def plan(
        self, config: PipelineConfig, *, draft_dir: Path, vocab: Path, features: FeatureSource
    ) -> ExportPlan:
        draft = Path(draft_dir)
        return ExportPlan(
            stage=self.name,
            fingerprint=draft.name,
            out_dir=draft,
            features=features,
            vocab=vocab_file(vocab),
            settings=export_settings(config),
        )

    def run_unit(
        self,
        config: PipelineConfig,
        plan: ExportPlan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:
        shards = plan.features.shards_dir
        export = export_draft(
            config, plan.out_dir, plan.vocab, Path(shards) if shards else None, plan.export_dir
        )
        # the data record travels with the export into the registry
        if (plan.out_dir / TRAINED_ON).exists():
            atomic_write_text(export / TRAINED_ON, (plan.out_dir / TRAINED_ON).read_text())
        logger.info("draft exported to %s", export)
        return UnitReport(unit=unit, detail={"export": str(export)})

    def unit_output(self, plan: ExportPlan, unit: Unit) -> Path:
        return plan.export_dir / WEIGHTS_FILE

    def retrigger(self, plan: ExportPlan, failed: Sequence[Unit]) -> str:
        shards = plan.features.shards_dir
        return (
            f"eagle3 export --draft-dir {plan.out_dir} --out {plan.export_dir} --vocab {plan.vocab}"
            + (f" --features {shards}" if shards else "")
        )

    def finalize(
        self,
        config: PipelineConfig,
        plan: ExportPlan,
        reports: Sequence[UnitReport],
        failed: Sequence[Unit],
    ) -> StageResult:
        if failed:
            return self.failed_result(plan, failed)
        write_failed_shards(plan.out_dir, [])
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=True,
            summary={"export": str(plan.export_dir)},
            markdown=(plan.export_dir / CARD_FILE).read_text(),
        )


class TrainedDraft(Frozen):
    """A trained and exported draft, what the train flow returns: its fingerprint and directory, the
    vocab and features it trained on, the training-sample count, the export directory, how it
    started (scratch or built on the champion: ``eagle3.train.continual``) and the train stage's
    summary."""

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
        return cls(
            fingerprint=train.fingerprint,
            out_dir=str(train.out_dir),
            vocab=s["vocab"],
            features_dir=s.get("features_dir"),
            train_samples=s["train_samples"],
            start=s.get("start", {}),
            summary=s,
        )

    def exported(self, export: StageResult) -> TrainedDraft:
        return self.model_copy(update={"export": export.summary["export"]})
