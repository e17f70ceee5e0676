"""The vocab flow: the draft vocabulary of a finished features stage (which target ids the draft can emit).

The one stage wiring (``flows.stage.run_stage``) over the library stage (``eagle3.train.vocab.VocabStage``), one
unit.
"""

from __future__ import annotations

from prefect import flow

from eagle3.config.pipeline import PipelineConfig
from eagle3.rundir.layout import VOCAB_FILE
from eagle3.train.vocab import VocabStage
from flows.stage import run_stage


@flow(name="vocab", log_prints=False)
def vocab_flow(config: PipelineConfig, features_dir: str | None = None) -> str:
    """Build the draft vocab of ``features_dir`` (default: the features stage this config names); returns the
    vocab.safetensors path."""
    return str(run_stage(VocabStage(), config, features_dir=features_dir).out_dir / VOCAB_FILE)
