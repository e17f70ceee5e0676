"""Prefect tasks of the capture stage: plan, one task per regen shard, finalize, and the draft vocab.

Placement: on the thread runner the shard tasks share one loaded model per process (``shared_backend``); with
``orchestration.task_runner == "ray"`` the capture flow submits them through ``flows.runners.shard_runner(config,
"capture")``, i.e. ``prefect_ray.context.remote_options(num_gpus=1)``, so Ray places one shard task per GPU
(``prefect_ray`` is imported only there, only when asked for). Tasks carry the ``capture`` tag for Prefect
concurrency limits (``prefect concurrency-limit create capture <n GPUs>``).

Cache key: the stage fingerprint and shard index, plus the size and mtime of the shard's output file, and no key
(no cache) while that file does not exist. The library already skips a finished shard cheaply (without loading the
model), so the Prefect cache is only a shortcut; keying it on the output file as well means a shard deleted or cut
short on disk is never skipped on a stale cache entry (DESIGN §8: a truncated file is rebuilt, not trusted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext

from eagle3.capture.run import capture_shard, finalize_features, output_paths
from eagle3.capture.stage import plan_capture
from eagle3.config import PipelineConfig
from eagle3.layout import ShardsFailed, write_failed_shards
from eagle3.lineage import Lineage
from eagle3.train.vocab import build_vocab_stage
from tasks.common import Progress, cache_key_from, output_cache_key, publish_markdown, publish_table


def _shard_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    """Fingerprint + shard index + the output file's size and mtime; None (never cached) while it is missing."""
    shard, _, _ = output_paths(Path(parameters["features_dir"]), int(parameters["shard_index"]))
    return output_cache_key(cache_key_from("fingerprint", "shard_index")(context, parameters), shard)


@task(name="capture-plan", cache_policy=NO_CACHE)
def plan_capture_task(
    config: PipelineConfig, regen_dir: str | None = None, shard_ids: list[int] | None = None
) -> dict[str, Any]:
    """Which shards of ``regen_dir`` (default: the regen stage this config names) are ready and where their features
    go (see ``eagle3.capture.stage.plan_capture``)."""
    regen = Lineage(config).input("regen", Path(regen_dir) if regen_dir else None)
    plan = plan_capture(config, regen_dir=regen, shard_ids=shard_ids)
    get_run_logger().info("capture %d shards from %s into %s (not ready: %s)", len(plan["shards"]),
                          plan["regen_dir"], plan["features_dir"], plan["missing"] or "none")
    return plan | {"progress_every_s": config.orchestration.progress_every_s}


@task(name="capture-shard", tags=["capture"], retries=1, retry_delay_seconds=30,
      cache_key_fn=_shard_cache_key, persist_result=True)
def capture_shard_task(
    config: PipelineConfig, regen_shard: str, features_dir: str, fingerprint: str, shard_index: int
) -> dict[str, Any]:
    """Capture one regen shard into its feature shard; a progress artifact tracks its samples."""
    progress: list[Progress] = []

    def report(done: int, total: int, tokens: int) -> None:
        if not progress:
            progress.append(Progress(f"capture-{fingerprint}-shard-{shard_index}", total=total,
                                     every_s=config.orchestration.progress_every_s))
        progress[0].update(done, tokens=tokens)

    result = capture_shard(config, Path(regen_shard), Path(features_dir), progress=report)
    get_run_logger().info("shard %d: %d rows, %d quarantined%s", shard_index, result["rows"],
                          result["quarantined"], " (already done)" if result["skipped"] else "")
    return result


@task(name="capture-finalize", cache_policy=NO_CACHE)
def finalize_features_task(
    config: PipelineConfig, plan: dict[str, Any], results: list[dict[str, Any]], failed: list[int]
) -> str:
    """Publish the shard table and summary, record failed shards; write the features manifest when none failed
    (else raise ``ShardsFailed`` with the re-trigger command). Returns the features directory."""
    fp, out = plan["fingerprint"], Path(plan["features_dir"])
    rows = [{"shard": r["shard_index"], "rows": r["rows"], "quarantined": r["quarantined"],
             "state": "skipped (done)" if r["skipped"] else "captured"} for r in results]
    rows += [{"shard": i, "rows": 0, "quarantined": 0, "state": "failed"} for i in failed]
    publish_table(f"capture-shards-{fp}", sorted(rows, key=lambda r: r["shard"]))
    publish_markdown(f"capture-summary-{fp}", f"# capture {fp}\n\n- features: `{out}`\n- shards captured: "
                     f"{len(results)}, failed: {failed or 'none'}, not ready in regen: {plan['missing'] or 'none'}\n")
    write_failed_shards(out, failed)
    if failed:
        shards = " ".join(f"--shard {i}" for i in failed)
        raise ShardsFailed("capture", out, failed, f"eagle3 capture --regen-dir {plan['regen_dir']} {shards}")
    get_run_logger().info("features manifest %s", finalize_features(config, out, results))
    return str(out)


@task(name="draft-vocab", retries=1, cache_policy=NO_CACHE)
def vocab_task(config: PipelineConfig, features_dir: str) -> str:
    """Build (or reuse) the draft vocab of a features stage; returns the vocab.safetensors path."""
    path = build_vocab_stage(config, Path(features_dir))
    get_run_logger().info("draft vocab %s", path)
    return str(path)
