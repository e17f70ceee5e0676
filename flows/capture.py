"""Capture flows: regen shards -> feature shards (one task per shard), then the draft vocab (DESIGN §7).

The flow only wires tasks: plan, submit every ready shard, follow them to completion (a progress artifact counts
shards and tokens, a table artifact shows each shard's state), finalize the manifest when none failed. Failed
shard ids are listed in the summary and the error for a re-trigger with ``shard_ids``. The task runner and Ray
placement come from the caller (``flows.runners``), as in the pipeline.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.futures import as_completed

from tasks.capture import capture_shard_task, finalize_features_task, plan_capture_task, vocab_task
from tasks.common import Progress, artifact_key, publish_markdown, publish_table


@flow(name="capture", log_prints=False)
def capture_flow(
    config: dict[str, Any], shard_ids: list[int] | None = None, regen_dir: str | None = None
) -> str:
    """Capture hidden states for the ready regen shards; returns the features directory."""
    plan = plan_capture_task(config, regen_dir, shard_ids)
    shards = {int(k): v for k, v in plan["shards"].items()}
    progress = Progress(artifact_key("capture", plan["fingerprint"]), total=len(shards), unit="shards",
                        every_s=plan["progress_every_s"])
    futures = {
        capture_shard_task.submit(config, path, plan["features_dir"], plan["fingerprint"], index): index
        for index, path in sorted(shards.items())
    }
    results, failed, tokens = [], [], 0
    for future in as_completed(list(futures)):
        value = future.result(raise_on_failure=False)  # a failed shard's exception, logged by its task run
        if isinstance(value, dict):
            results.append(value)
            tokens += value.get("tokens", 0)
        else:
            failed.append(futures[future])
        progress.update(len(results) + len(failed), tokens=tokens)
    rows = [{"shard": r["shard_index"], "rows": r["rows"], "quarantined": r["quarantined"],
             "state": "skipped (done)" if r["skipped"] else "captured"} for r in results]
    rows += [{"shard": i, "rows": 0, "quarantined": 0, "state": "failed"} for i in sorted(failed)]
    publish_table(f"capture-shards-{plan['fingerprint']}", sorted(rows, key=lambda r: r["shard"]))
    summary = (f"# capture {plan['fingerprint']}\n\n- features: `{plan['features_dir']}`\n"
               f"- shards captured: {len(results)}, failed: {sorted(failed) or 'none'}, "
               f"regen shards not ready: {plan['missing'] or 'none'}\n")
    publish_markdown(f"capture-summary-{plan['fingerprint']}", summary)
    if failed:
        raise RuntimeError(f"capture failed for shards {sorted(failed)}; re-run with shard_ids={sorted(failed)}")
    return finalize_features_task(config, plan["features_dir"], results)


@flow(name="vocab", log_prints=False)
def vocab_flow(config: dict[str, Any], features_dir: str) -> str:
    """Build the draft vocab from a features stage; returns the vocab.safetensors path."""
    return vocab_task(config, features_dir)
