"""Prefect tasks of the data-scaling pipeline: make sure the tiny world exists, plan tonight's
shards, publish the night's summary and plots (the scaling curve is a stage: ``flows.gate.scaling_flow``).

Thin wrappers over ``eagle3.scaling``, the config loader and the tiny-world builder. No Prefect result cache on any
of them: each is quick and reads the run root, which is the truth (the curve tells tonight's total; a cached plan
could not see a night recorded since).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.bench.report_md import serving_lines
from eagle3.config import PipelineConfig
from eagle3.recipes import eagle3_home
from eagle3.runroot import Manifest
from eagle3.scaling import plan_night, previous_total, read_curve, shard_rows
from tasks.common import publish_markdown, publish_plots


@task(name="tiny-world", cache_policy=NO_CACHE)
def tiny_world_task(config: PipelineConfig) -> str | None:
    """Build (or reuse) the tiny offline world when the config asks for it, so a deployment of the tiny recipe runs
    on a fresh worker; returns its directory (None for real targets)."""
    if not config.dev.tiny_world:
        return None
    from eagle3.dev.think_world import build_think_world
    from eagle3.dev.world import build_tiny_world

    cache = Path(config.dev.cache_dir) if config.dev.cache_dir else eagle3_home() / "cache"
    world, hit = (build_think_world if config.dev.world == "think" else build_tiny_world)(cache)
    get_run_logger().info("%s world %s at %s", config.dev.world, "reused" if hit else "built", world.root)
    return str(world.root)


@task(name="plan-night", cache_policy=NO_CACHE)
def plan_night_task(
    config: PipelineConfig, prompts_dir: str, scale: int | None, shard_ids: list[int] | None = None
) -> dict[str, Any]:
    """Tonight's prompt shards: explicit ``shard_ids`` win; else the curve's last total + ``scale`` (whole shards)."""
    log = get_run_logger()
    manifest = Manifest.read(Path(prompts_dir))
    if manifest is None:
        raise FileNotFoundError(f"{prompts_dir} has no manifest: the normalize stage did not finish")
    rows = shard_rows(manifest.files)
    root = config.root_path
    plan = plan_night(rows, scale=scale, previous_total=previous_total(read_curve(root)))
    selected = plan.shard_ids if shard_ids is None else sorted(set(shard_ids))
    unknown = [k for k in selected if not 0 <= k < len(rows)]
    if unknown:
        raise ValueError(f"shard_ids {unknown} do not exist: the prompts stage has shards 0..{len(rows) - 1}")
    log.info(
        "tonight: %d prompts in shards %s (%d new), pool %d%s",
        plan.total_prompts,
        selected,
        len(plan.new_shard_ids),
        plan.pool_prompts,
        ", pool exhausted" if plan.exhausted else "",
    )
    return {
        "total_prompts": sum(rows[k] for k in selected),
        "shard_ids": selected,
        "new_shard_ids": plan.new_shard_ids if shard_ids is None else selected,
        "pool_prompts": plan.pool_prompts,
        "exhausted": plan.exhausted,
    }


@task(name="night-summary", cache_policy=NO_CACHE)
def publish_summary_task(summary: dict[str, Any]) -> str:
    """The night in a few Markdown lines (artifact ``data-scaling-summary``); returns the Markdown."""
    night, gate, curve = summary["night"], summary["gate"], summary["curve"]
    verdicts = {"pass": "PASS (promoted)", "inconclusive": "INCONCLUSIVE (nothing promoted)"}
    verdict = verdicts.get(gate["verdict"], "REFUSED")
    exhausted = " - pool exhausted" if night["exhausted"] else ""
    markdown = "\n".join(
        [
            "# Data-scaling night",
            "",
            f"- prompts: {night['total_prompts']:,} in shards {night['shard_ids']} "
            f"({len(night['new_shard_ids'])} new){exhausted}",
            f"- draft: `{summary['draft']['export']}`",
            f"- gate: **{verdict}**, report `{gate['markdown']}`",
            *serving_lines(gate),
            f"- scaling curve: {curve['points']} nights, {curve['verdict']} (`{curve['png']}`)",
            "",
        ]
    )
    publish_markdown("data-scaling-summary", markdown, description=f"gate {verdict}")
    return markdown


@task(name="night-plots", cache_policy=NO_CACHE)
def night_plots_task(draft_dir: str, gate_report: str, curve_png: str) -> str | None:
    """The night's plots as images in the UI (artifact ``night-plots`` on the nightly run): the training curves,
    the gate's throughput-vs-concurrency and accept-length plots (beside its report) and the scaling curve."""
    from eagle3.bench.report import ACCEPT_PNG, THROUGHPUT_PNG
    from eagle3.train.metrics import PLOT_FILE

    report_dir = Path(gate_report).parent
    plots = {
        "Training: loss and accuracy per TTT step": Path(draft_dir) / PLOT_FILE,
        "Gate: throughput vs concurrency": report_dir / THROUGHPUT_PNG,
        "Gate: accept length": report_dir / ACCEPT_PNG,
        "Scaling curve": Path(curve_png),
    }
    markdown = publish_plots("night-plots", plots, description="training curves, gate plots, scaling curve")
    get_run_logger().info("night plots: %s", ", ".join(str(p) for p in plots.values() if p.is_file()))
    return markdown
