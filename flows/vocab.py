"""The vocab flow: the draft vocabulary of the samples the draft trains on (which target ids the
draft can emit).

The one stage wiring (``flows.stage.run_stage``) over the library stage
(``eagle3.train.vocab.VocabStage``), one unit.
"""

from __future__ import annotations

from prefect import flow

from eagle3.capture.stage import FeatureSource
from eagle3.config.pipeline import PipelineConfig
from eagle3.rundir.layout import VOCAB_FILE
from eagle3.train.vocab import VocabStage
from flows.stage import run_stage


@flow(name="vocab", log_prints=False)
def vocab_flow(config: PipelineConfig, features: FeatureSource) -> str:
    """Build the draft vocab of ``features`` (the stored shards, or the online plan's samples);
    returns the vocab.safetensors path."""
    return str(run_stage(VocabStage(), config, features=features).out_dir / VOCAB_FILE)
