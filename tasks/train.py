"""Prefect tasks of the train stage: run the training workers (torchrun or one process) and export the draft.

The train task streams the workers' log lines to the run logger and turns ``metrics.jsonl`` into a progress
artifact (steps, tokens/s, ETA). A retry re-runs the same command, which resumes from ``<out>/ckpt/latest``.
Cache keys are the draft fingerprint (features + vocab + train config + target) and the output directory, and
exist only while the output does (``output_cache_key``): a cached result never points at a deleted or moved draft.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.context import TaskRunContext

from eagle3.config import PipelineConfig
from eagle3.layout import EXPORT_DIR, stage_dir
from eagle3.model.export_format import CARD_FILE, WEIGHTS_FILE
from eagle3.runroot import Manifest, atomic_write_text
from eagle3.train.distributed import run_workers, worker_command
from eagle3.train.export import export_draft
from eagle3.train.metrics import METRICS_FILE, read_metrics
from eagle3.train.trainer import draft_fingerprint
from tasks.common import Progress, artifact_key, cache_key_from, output_cache_key, publish_markdown


def _vocab_file(vocab: str) -> Path:
    path = Path(vocab)
    return path / "vocab.safetensors" if path.is_dir() else path


@task(name="plan-draft")
def plan_draft_task(config: PipelineConfig, features_dir: str, vocab: str) -> dict[str, Any]:
    """The draft's fingerprint, output directory and training-sample count (from the features manifest)."""
    vocab_file = _vocab_file(vocab)
    fp = draft_fingerprint(config, Path(features_dir).name, vocab_file.parent.name)
    manifest = Manifest.read(Path(features_dir))
    samples = manifest.rows if manifest else 0
    return {"fingerprint": fp, "out_dir": str(stage_dir(config.root_path, "train", fp)), "vocab": str(vocab_file),
            "train_samples": samples}


def _train_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    base = cache_key_from("fingerprint", "out_dir")(context, parameters)
    return output_cache_key(base, Path(parameters["out_dir"]) / "ckpt" / "latest")


def _export_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    base = cache_key_from("fingerprint", "out_dir")(context, parameters)
    return output_cache_key(base, Path(parameters["out_dir"]) / EXPORT_DIR / WEIGHTS_FILE)


@task(name="train-draft", retries=2, retry_delay_seconds=10, cache_key_fn=_train_cache_key, persist_result=True)
def train_draft_task(
    config: PipelineConfig, features_dir: str, vocab_path: str, out_dir: str, fingerprint: str
) -> dict[str, Any]:
    """Run ``python -m eagle3.train`` (under torchrun when ``train.nproc > 1``) and follow its metrics."""
    log = get_run_logger()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_yaml = out / "config.yaml"
    atomic_write_text(config_yaml, config.to_yaml())
    command = worker_command(config_yaml, Path(features_dir), Path(vocab_path), out, nproc=config.train.nproc)
    progress = Progress(artifact_key("train", fingerprint), total=1, unit="steps",
                        every_s=config.orchestration.progress_every_s)
    seen = 0

    def on_line(line: str) -> None:
        nonlocal seen
        log.info(line)
        records = read_metrics(out / METRICS_FILE)
        if len(records) > seen:
            seen, last = len(records), records[-1]
            progress.total = max(int(last.get("total_steps", 1)), 1)
            progress.update(int(last["step"]), tokens=int(last.get("tokens", 0)))

    log.info("starting: %s", " ".join(command))
    code = run_workers(command, on_line)
    if code != 0:
        raise RuntimeError(f"training exited with code {code}; a retry resumes from {out / 'ckpt' / 'latest'}")
    progress.update(progress.total, force=True)
    records = read_metrics(out / METRICS_FILE)
    return {"out_dir": str(out), "steps": records[-1]["step"] if records else None,
            "final": records[-1] if records else {}}


@task(name="export-draft", retries=1, cache_key_fn=_export_cache_key, persist_result=True)
def export_draft_task(
    config: PipelineConfig, out_dir: str, vocab_path: str, features_dir: str, fingerprint: str
) -> str:
    """Export the latest checkpoint to ``<out>/export`` (validated) and publish the model card."""
    export = export_draft(config, Path(out_dir), Path(vocab_path), Path(features_dir),
                          Path(out_dir) / EXPORT_DIR)  # validated before it is renamed into place
    publish_markdown(artifact_key("draft-card", fingerprint), (export / CARD_FILE).read_text(),
                     description=f"EAGLE-3 draft {fingerprint}")
    get_run_logger().info("draft exported to %s", export)
    return str(export)



