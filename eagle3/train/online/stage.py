"""The train stage for ``train.features=online`` (and ``auto`` when it picks online), and the vocab it trains with.

``OnlineTrainStage`` is ``TrainStage`` with the regen shards as input instead of a features stage. The draft's
fingerprint covers the features fingerprint those shards give and the vocab, not how the states reached the
trainer: given the same vocab file, online and stored training plan the same draft directory. (A night's vocab
directories differ by path: the stored vocab is keyed by the feature shards' checksums, which an online night never
has, so its vocab is keyed by the regen shards; the two hold the same ids, ``tests/unit/online``.) Its one unit
runs ``eagle3.train.online.run``: the broker, the producer actors and the trainer workers (``python -m eagle3.train.online``,
under torchrun for ``train.nproc > 1``); a failed attempt is retried like the stored stage's and resumes from
``ckpt/latest``, the producers re-capturing only what that checkpoint does not hold.

``OnlineVocabStage`` counts the draft vocab over the samples the plan trains on (the admitted rows of the regen
shards, exactly the rows capture would write), so online and stored training of one night select the same vocab.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from eagle3.capture.shard import features_fingerprint
from eagle3.config.pipeline import PipelineConfig
from eagle3.errors import DATA_ERROR_PREFIX, DataError
from eagle3.model.vocab import save_vocab
from eagle3.capture.costs import choose_features
from eagle3.capture.shard import regen_shards
from eagle3.train.online.plan import OnlinePlan
from eagle3.train.online.status import producer_table, read_online_status, status_note
from eagle3.rundir.layout import CKPT_DIR, CONFIG_FILE, VOCAB_FILE, stage_dir
from eagle3.rundir.runroot import FileEntry, Manifest, atomic_write_text, fingerprint
from eagle3.stage import LiveTable, OnProgress, Plan, Progress, StageResult, Unit, UnitReport
from eagle3.train.export import export_draft
from eagle3.train.stage import (
    ExportPlan,
    ExportStage,
    TrainPlan,
    TrainStage,
    _trained,
    export_settings,
    vocab_file,
)
from eagle3.train.trainer import draft_fingerprint
from eagle3.train.vocab import VocabStage, build_vocab, coverage, vocab_fingerprint

logger = logging.getLogger(__name__)


def regen_set_fingerprint(regen_dir: Path) -> str:
    """Identity of the regen shards an online night trains on (names and sizes: a rebuilt shard is another set)."""
    return fingerprint("online-regen", Path(regen_dir).name,
                       [(p.name, p.stat().st_size) for p in regen_shards(regen_dir)])


class OnlineVocabPlan(Plan):
    regen_dir: Path


class OnlineVocabStage(VocabStage):
    """The draft vocab over the online plan's samples (one unit)."""

    inputs: ClassVar[dict[str, str]] = {"regen_dir": "regen"}

    def plan(self, config: PipelineConfig, *, regen_dir: Path) -> OnlineVocabPlan:  # type: ignore[override]
        fp = vocab_fingerprint(config, regen_set_fingerprint(regen_dir))
        return OnlineVocabPlan(stage=self.name, fingerprint=fp, out_dir=stage_dir(config.root_path, "vocab", fp),
                               regen_dir=Path(regen_dir))

    def run_unit(self, config: PipelineConfig, plan: OnlineVocabPlan, unit: Unit, *,  # type: ignore[override]
                 env: Any = None, on_progress: OnProgress | None = None) -> UnitReport:
        path = plan.out_dir / VOCAB_FILE
        if Manifest.read(plan.out_dir) is not None and path.exists():
            return UnitReport(unit=unit, skipped=True, rows=config.vocab.draft_vocab_size, detail={"path": str(path)})
        samples = [s for g in OnlinePlan.for_night(config, plan.regen_dir, world_size=1).groups for s in g]
        counts = np.zeros(config.target.vocab_size, dtype=np.int64)
        for s in samples:
            ids = np.asarray(s.input_ids, dtype=np.int64)[np.asarray(s.loss_mask, dtype=bool)]
            counts += np.bincount(ids, minlength=len(counts))
        counts_t = torch.from_numpy(counts)
        vocab = build_vocab(counts_t, config.vocab.draft_vocab_size)
        save_vocab(vocab, path)
        stats = {"coverage": round(coverage(counts_t, vocab), 6), "loss_tokens": int(counts.sum()),
                 "draft_vocab_size": vocab.draft_vocab_size, "from": "online plan (regen shards)"}
        Manifest(stage="vocab", fingerprint=plan.out_dir.name,
                 files=[FileEntry.of(path, rows=vocab.draft_vocab_size, base=plan.out_dir)],
                 config={"vocab": config.vocab.model_dump(), "regen": str(plan.regen_dir)},
                 stats=stats).write(plan.out_dir)
        return UnitReport(unit=unit, rows=config.vocab.draft_vocab_size, detail={"path": str(path)})


class OnlineTrainPlan(TrainPlan):
    regen_dir: Path
    why: str  # the train.features decision, for the log and the summary


class OnlineTrainStage(TrainStage):
    """Train the draft online from the regen shards and a vocab (one unit: the whole run, as ``TrainStage``)."""

    inputs: ClassVar[dict[str, str]] = {"regen_dir": "regen", "vocab": "vocab"}

    def plan(self, config: PipelineConfig, *, regen_dir: Path, vocab: Path) -> OnlineTrainPlan:  # type: ignore[override]
        regen, vocab_path = Path(regen_dir), vocab_file(vocab)
        features_fp = features_fingerprint(config, regen.name)
        fp = draft_fingerprint(config, features_fp, vocab_path.parent.name)
        why = choose_features(config, regen_dir=regen).why
        online = OnlinePlan.for_night(config, regen, world_size=config.train.nproc)
        samples = sum(len(g) for g in online.groups)
        planned = config.train.max_steps or config.train.epochs * max(online.steps_per_epoch, 1)
        return OnlineTrainPlan(stage=self.name, fingerprint=fp, out_dir=stage_dir(config.root_path, "train", fp),
                               features_dir=stage_dir(config.root_path, "capture", features_fp), vocab=vocab_path,
                               train_samples=samples, planned_steps=planned, regen_dir=regen, why=why)

    def run_unit(self, config: PipelineConfig, plan: OnlineTrainPlan, unit: Unit, *,  # type: ignore[override]
                 env: Any = None, on_progress: OnProgress | None = None) -> UnitReport:
        from eagle3.train.online.transport import ray_session

        if _trained(plan.out_dir):
            logger.info("draft %s is already trained (%s)", plan.fingerprint, plan.out_dir / CKPT_DIR)
            return UnitReport(unit=unit, skipped=True, rows=plan.train_samples)
        logger.info("%s", plan.why)
        plan.out_dir.mkdir(parents=True, exist_ok=True)
        config_yaml = plan.out_dir / CONFIG_FILE
        atomic_write_text(config_yaml, config.to_yaml())
        with ray_session(config.orchestration.ray_address):
            code, store, data_errors, producer_errors = _train_online(config, plan, config_yaml)
        if code != 0 and data_errors:
            raise DataError(data_errors[0])
        if code != 0:
            raise RuntimeError(f"online training exited with code {code}; a retry resumes from "
                               f"{plan.out_dir / CKPT_DIR}; producers: {producer_errors or 'ok'}")
        logger.info("online store at the end: %s", {k: store[k] for k in ("delivered", "consumed", "duplicates",
                                                                          "reclaimed", "ready")})
        return UnitReport(unit=unit, rows=plan.train_samples, detail={"store": store, "features": "online"})

    def progress(self, plan: OnlineTrainPlan) -> Progress:  # type: ignore[override]
        """The trainer's steps (``TrainStage.progress``: steps and tokens, so the card shows tokens/s), noted with
        the store's backlog, the trainer's samples/s and the producers from the run's ``online-status.json``."""
        status = read_online_status(plan.out_dir)
        progress = super().progress(plan)
        return progress if status is None else progress.model_copy(update={"note": status_note(status)})

    def live_tables(self, plan: OnlineTrainPlan) -> dict[str, LiveTable]:  # type: ignore[override]
        """``producers``: one row per producer (state, batches, rate, restarts, last error), the trainer, the store."""
        status = read_online_status(plan.out_dir)
        return {} if status is None else {"producers": producer_table(status)}

    def retrigger(self, plan: OnlineTrainPlan, failed: Sequence[Unit]) -> str:  # type: ignore[override]
        return f"eagle3 train --set train.features=online  # regen {plan.regen_dir}, vocab {plan.vocab}"

    def finalize(self, config: PipelineConfig, plan: OnlineTrainPlan, reports: Sequence[UnitReport],  # type: ignore[override]
                 failed: Sequence[Unit]) -> StageResult:
        result = super().finalize(config, plan, reports, failed)
        store = next((r.detail.get("store") for r in reports if r.detail.get("store")), None)
        summary = {**result.summary, "features": "online", "features_decision": plan.why,
                   "regen_dir": str(plan.regen_dir), "store": store}
        return result.model_copy(update={"summary": summary})


def _train_online(config: PipelineConfig, plan: OnlineTrainPlan,
                  config_yaml: Path) -> tuple[int, dict[str, Any], list[str], list[str]]:
    """The trainer workers and the producers over the run's broker, inside the unit's Ray session: the workers'
    exit code, the store at the end, the data errors the workers reported and the producers' errors."""
    from eagle3.train.online.run import finish_run, open_run, start_producers, status_reporter, worker_command
    from eagle3.train.distributed import run_workers

    _, name = open_run(config, plan.regen_dir, plan.out_dir, world_size=config.train.nproc,
                       ray_address=config.orchestration.ray_address)
    import ray

    producers = start_producers(config, plan.regen_dir, config.train.nproc, name)
    command = worker_command(config_yaml, plan.regen_dir, plan.vocab, plan.out_dir,
                             address=ray.get_runtime_context().gcs_address, broker=name,
                             nproc=config.train.nproc)
    data_errors: list[str] = []

    def on_line(line: str) -> None:
        logger.info("%s", line)
        if DATA_ERROR_PREFIX in line:
            data_errors.append(line.split(DATA_ERROR_PREFIX, 1)[1])

    reporter = status_reporter(config, name, plan.out_dir, producers)
    try:
        with reporter:
            code = run_workers(command, on_line)
        reporter.report()
    finally:
        producers.stop()
        store = finish_run(name)
    return code, store, data_errors, producers.errors


class OnlineExportPlan(ExportPlan):
    features_dir: Path | None = None  # online: no features stage exists


class OnlineExportStage(ExportStage):
    """``ExportStage`` for a draft trained online: no features manifest exists, so the layer ids are the config's
    (the ones the producers captured, checked on every batch through the features fingerprint)."""

    inputs: ClassVar[dict[str, str]] = {"vocab": "vocab"}

    def plan(self, config: PipelineConfig, *, draft_dir: Path, vocab: Path,  # type: ignore[override]
             features_dir: Path | None = None) -> OnlineExportPlan:
        draft = Path(draft_dir)
        return OnlineExportPlan(stage=self.name, fingerprint=draft.name, out_dir=draft, vocab=vocab_file(vocab),
                                settings=export_settings(config))

    def run_unit(self, config: PipelineConfig, plan: ExportPlan, unit: Unit, *,  # type: ignore[override]
                 env: Any = None, on_progress: OnProgress | None = None) -> UnitReport:
        export = export_draft(config, plan.out_dir, plan.vocab, None, plan.export_dir)
        logger.info("draft exported to %s", export)
        return UnitReport(unit=unit, detail={"export": str(export)})

    def retrigger(self, plan: ExportPlan, failed: Sequence[Unit]) -> str:  # type: ignore[override]
        return f"eagle3 export --draft-dir {plan.out_dir} --out {plan.export_dir} --vocab {plan.vocab}"
