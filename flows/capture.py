"""Capture flows: regen shards -> feature shards (one task per shard), then the draft vocab (DESIGN §7).

The flow only wires tasks: plan, submit every ready shard, follow them to completion (a progress artifact counts
shards and tokens), finalize (a table artifact shows each shard's state; the manifest when none failed). A failed
shard does not stop the others; the stage then fails with the re-trigger command (``eagle3.layout.ShardsFailed``).
The shard tasks run on the config's task runner with its Ray placement (``flows.runners.shard_runner``).
"""

from __future__ import annotations

from prefect import flow

from eagle3.config import PipelineConfig
from flows.runners import shard_runner
from tasks.capture import capture_shard_task, finalize_features_task, plan_capture_task, vocab_task
from tasks.common import Progress, artifact_key, gather_shards


@flow(name="capture", log_prints=False)
def capture_flow(
    config: PipelineConfig, shard_ids: list[int] | None = None, regen_dir: str | None = None
) -> str:
    """Capture hidden states for the ready regen shards; returns the features directory."""
    plan = plan_capture_task(config, regen_dir, shard_ids)
    progress = Progress(artifact_key("capture", plan["fingerprint"]), total=len(plan["shards"]), unit="shards",
                        every_s=plan["progress_every_s"])
    shared = {"config": config, "features_dir": plan["features_dir"], "fingerprint": plan["fingerprint"]}
    with shard_runner(config, "capture") as runner:
        futures = {
            runner.submit(capture_shard_task, shared | {"regen_shard": path, "shard_index": int(index)}): int(index)
            for index, path in sorted(plan["shards"].items())
        }
        results, failed = gather_shards(futures, lambda done, failed: progress.update(
            len(done) + len(failed), tokens=sum(r.get("tokens", 0) for r in done)))  # fmt: skip
    return finalize_features_task(config, plan, results, failed)


@flow(name="vocab", log_prints=False)
def vocab_flow(config: PipelineConfig, features_dir: str) -> str:
    """Build the draft vocab from a features stage; returns the vocab.safetensors path."""
    return vocab_task(config, features_dir)
