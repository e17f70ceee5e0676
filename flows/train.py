"""The train flow: train the draft (torchrun workers, on stored or online features), then export the
SGLang directory.

Both are the one stage wiring (``flows.stage.run_stage``) over their library stage
(``eagle3.train.stage``): the export reads the draft directory, vocab and features the train stage
planned.
"""

from __future__ import annotations

from prefect import flow

from eagle3.capture.stage import FeatureSource
from eagle3.config.pipeline import PipelineConfig
from eagle3.train.stage import ExportStage, TrainedDraft, TrainStage
from flows.stage import run_stage


@flow(name="train", log_prints=False)
def train_flow(
    config: PipelineConfig, features: FeatureSource, vocab: str | None = None
) -> TrainedDraft:
    """Train an EAGLE-3 draft on ``features`` (the capture flow's decision) and a vocab (default:
    the one this config names), then export it; returns the ``TrainedDraft`` (fingerprint,
    directory, vocab, training samples, export, start)."""
    train = run_stage(TrainStage(), config, features=features, vocab=vocab)
    draft = TrainedDraft.of(train)
    export = run_stage(
        ExportStage(), config, draft_dir=draft.out_dir, vocab=draft.vocab, features=features
    )
    return draft.exported(export)
