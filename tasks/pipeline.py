"""Prefect tasks of the data-scaling pipeline: make sure the tiny world exists, plan tonight's
prompts, publish the night's summary and plots (the scaling curve is a stage: ``flows.gate.scaling_flow``).

Thin wrappers over ``eagle3.bench.night`` (tonight's plan under either policy), the config loader and the tiny-world
builder. No Prefect result cache on any of them: each reads the run root, which is the truth (the curve tells
tonight's total; a cached plan could not see a night recorded since).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.bench.report_md import serving_lines
from eagle3.config import PipelineConfig
from eagle3.recipes import world_cache
from tasks.common import publish_markdown, publish_plots


@task(name="tiny-world", cache_policy=NO_CACHE)
def tiny_world_task(config: PipelineConfig) -> str | None:
    """Build (or reuse) the tiny offline world when the config asks for it, so a deployment of the tiny recipe runs
    on a fresh worker; returns its directory (None for real targets)."""
    if not config.dev.tiny_world:
        return None
    from eagle3.dev.world import world_builders

    cache = Path(config.dev.cache_dir) if config.dev.cache_dir else world_cache()
    world, hit = world_builders()[config.dev.world](cache)
    get_run_logger().info("%s world %s at %s", config.dev.world, "reused" if hit else "built", world.root)
    return str(world.root)


@task(name="plan-night", cache_policy=NO_CACHE)
def plan_night_task(
    config: PipelineConfig, prompts_dir: str, scale: int | None, shard_ids: list[int] | None = None
) -> dict[str, Any]:
    """Tonight's prompts by ``scaling.policy``: explicit ``shard_ids`` win; uniform takes the curve's last total +
    ``scale`` (whole shards); aimed selects rows per domain (``eagle3.bench.night``). The plan is the ``night-plan``
    Markdown artifact on the nightly run (and in its summary)."""
    from eagle3.bench.night import plan_tonight  # torch: only the aimed plan measures a draft

    night = plan_tonight(config, Path(prompts_dir), scale, shard_ids)
    get_run_logger().info(
        "tonight (%s): %d prompts in shards %s (%d new), pool %d%s",
        night["policy"],
        night["total_prompts"],
        night["shard_ids"],
        len(night["new_shard_ids"]),
        night["pool_prompts"],
        ", pool exhausted" if night["exhausted"] else "",
    )
    publish_markdown("night-plan", night["plan_markdown"], description=f"tonight: {night['policy']}")
    return night


@task(name="night-summary", cache_policy=NO_CACHE)
def publish_summary_task(summary: dict[str, Any]) -> str:
    """The night in a few Markdown lines (artifact ``data-scaling-summary``); returns the Markdown."""
    from eagle3.train.continual import start_line

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
            f"- features: {summary.get('features_mode') or 'train.features=stored'}",
            start_line(summary["draft"].get("start", {})),
            f"- gate: **{verdict}**, report `{gate['markdown']}`",
            *serving_lines(gate),
            f"- scaling curve: {curve['points']} nights, {curve['verdict']} (`{curve['png']}`)",
            "",
            night["plan_markdown"],
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
