"""The capture flow: regen shards -> feature shards (one task per shard).

It is the one stage wiring (``flows.stage.run_stage``) over the library stage
(``eagle3.capture.stage``): plan, units, finalize. A capture shard task asks Ray for one GPU when
``capture.device`` is CUDA (``flows.runners``) and carries the ``capture`` tag for Prefect
concurrency limits (``prefect concurrency-limit create capture <n GPUs>``); on the thread runner the
shard tasks of one process share one loaded model. A failed shard does not stop the others; the
stage then fails with the re-trigger command. The plan decides ``train.features`` for the night:
online, nothing is captured here (the trainer's producers capture during training).
"""

from __future__ import annotations

from prefect import flow

from eagle3.capture.stage import CaptureStage, FeatureSource
from eagle3.config.pipeline import PipelineConfig
from flows.stage import run_stage


@flow(name="capture", log_prints=False)
def capture_flow(
    config: PipelineConfig, shard_ids: list[int] | None = None, regen_dir: str | None = None
) -> FeatureSource:
    """Capture hidden states for the ready shards of ``regen_dir`` (default: the regen stage this
    config names); returns where the trainer's features come from: the features directory, or online
    (nothing captured)."""
    return FeatureSource.of(
        run_stage(CaptureStage(), config, regen_dir=regen_dir, shard_ids=shard_ids)
    )
