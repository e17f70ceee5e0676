"""The train flow: plan the draft directory, train (torchrun workers), export the SGLang directory."""

from __future__ import annotations

from typing import Any

from prefect import flow

from eagle3.config import PipelineConfig
from tasks.train import export_draft_task, plan_draft_task, train_draft_task


@flow(name="train", log_prints=False)
def train_flow(config: PipelineConfig, features_dir: str, vocab: str) -> dict[str, Any]:
    """Train an EAGLE-3 draft on finished features and a vocab, then export it; returns paths and the summary."""
    plan = plan_draft_task(config, features_dir, vocab)
    summary = train_draft_task(config, features_dir, plan["vocab"], plan["out_dir"], plan["fingerprint"])
    export = export_draft_task(config, plan["out_dir"], plan["vocab"], features_dir, plan["fingerprint"])
    return {**plan, "export": export, "summary": summary}
