"""The train flow: train the draft (torchrun workers), then export the SGLang directory.

Both are the one stage wiring (``flows.stage.run_stage``) over their library stage (``eagle3.train.stage``): the
export reads the draft directory, vocab and features the train stage planned.
"""

from __future__ import annotations

from prefect import flow

from eagle3.config.pipeline import PipelineConfig
from eagle3.train.stage import ExportStage, TrainedDraft, TrainStage
from flows.stage import run_stage


@flow(name="train", log_prints=False)
def train_flow(config: PipelineConfig, features_dir: str | None = None, vocab: str | None = None) -> TrainedDraft:
    """Train an EAGLE-3 draft on finished features and a vocab (default: the ones this config names), then export
    it; returns the ``TrainedDraft`` (fingerprint, directory, vocab, training samples, export, start)."""
    draft = TrainedDraft.of(run_stage(TrainStage(), config, features_dir=features_dir, vocab=vocab))
    return draft.exported(run_stage(ExportStage(), config, draft_dir=draft.out_dir, vocab=draft.vocab,
                                    features_dir=draft.features_dir))  # fmt: skip


@flow(name="train-online", log_prints=False)
def online_train_flow(config: PipelineConfig, regen_dir: str, vocab: str | None = None) -> TrainedDraft:
    """``train_flow`` for ``train.features=online`` (issue 48): the draft vocab over the regen shards' planned samples,
    online training (capture producers feeding the trainer, no feature shard), then the export; the same return."""
    from eagle3.train.online.stage import OnlineExportStage, OnlineTrainStage, OnlineVocabStage
    from eagle3.rundir.layout import VOCAB_FILE

    if vocab is None:
        vocab = str(run_stage(OnlineVocabStage(), config, regen_dir=regen_dir).out_dir / VOCAB_FILE)
    draft = TrainedDraft.of(run_stage(OnlineTrainStage(), config, regen_dir=regen_dir, vocab=vocab))
    return draft.exported(run_stage(OnlineExportStage(), config, draft_dir=draft.out_dir, vocab=draft.vocab))
