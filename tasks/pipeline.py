"""Prefect tasks of the data-scaling pipeline: make sure the tiny world exists, publish the night's
summary and plots (tonight's plan and the scaling curve are stages: ``eagle3.scaling.stage``).

Thin wrappers over the tiny-world builder and the night's typed results
(``eagle3.scaling.stage.NightSummary``). No Prefect result cache on any of them: each reads the run
root, which is the truth.
"""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config.pipeline import PipelineConfig
from eagle3.gate.report_md import serving_lines
from eagle3.recipes import world_cache
from eagle3.scaling.stage import NightSummary
from tasks.common import publish_markdown, publish_plots


@task(name="tiny-world", cache_policy=NO_CACHE)
def tiny_world_task(config: PipelineConfig) -> str | None:
    """Build (or reuse) the tiny offline world when the config asks for it, so a deployment of the
    tiny recipe runs on a fresh worker; returns its directory (None for real targets)."""
    if not config.dev.tiny_world:
        return None
    from eagle3.worlds.world import world_builders

    cache = Path(config.dev.cache_dir) if config.dev.cache_dir else world_cache()
    world, hit = world_builders()[config.dev.world](cache)
    get_run_logger().info(
        "%s world %s at %s", config.dev.world, "reused" if hit else "built", world.root
    )
    return str(world.root)


@task(name="night-summary", cache_policy=NO_CACHE)
def publish_summary_task(summary: NightSummary) -> str:
    """The night in a few Markdown lines (artifact ``data-scaling-summary``); returns the
    Markdown."""
    from eagle3.train.continual import start_line

    night, gate, curve = summary.night, summary.gate, summary.curve
    verdicts = {"pass": "PASS (promoted)", "inconclusive": "INCONCLUSIVE (nothing promoted)"}
    verdict = verdicts.get(gate.verdict, "REFUSED")
    exhausted = " - pool exhausted" if night.exhausted else ""
    rows = summary.rows_line()
    markdown = "\n".join(
        [
            "# Data-scaling night",
            "",
            f"- target: `{Path(summary.target).name}` ({summary.target}); data: "
            f"{', '.join(summary.sources) or '-'}",
            f"- prompts: {night.total_prompts:,} in shards {night.shard_ids} "
            f"({len(night.new_shard_ids)} new){exhausted}",
            f"- rows: {rows}",
            f"- draft: `{summary.draft.export}`",
            f"- features: {summary.features_mode or 'train.features=stored'}",
            start_line(summary.draft.start),
            f"- gate: **{verdict}**, report `{gate.markdown}`",
            *serving_lines(gate.serving()),
            f"- scaling curve: {curve.points} nights, {curve.verdict} (`{curve.png}`)",
            "",
            night.plan_markdown,
        ]
    )
    publish_markdown("data-scaling-summary", markdown, description=f"gate {verdict}")
    return markdown


@task(name="night-plots", cache_policy=NO_CACHE)
def night_plots_task(draft_dir: str, gate_report: str, curve_png: str) -> str | None:
    """The night's plots as images in the UI (artifact ``night-plots`` on the nightly run): the
    training curves, the gate's throughput-vs-concurrency and accept-length plots (beside its
    report) and the scaling curve."""
    from eagle3.gate.report import ACCEPT_PNG, THROUGHPUT_PNG
    from eagle3.train.metrics import PLOT_FILE

    report_dir = Path(gate_report).parent
    plots = {
        "Training: loss and accuracy per TTT step": Path(draft_dir) / PLOT_FILE,
        "Gate: throughput vs concurrency": report_dir / THROUGHPUT_PNG,
        "Gate: accept length": report_dir / ACCEPT_PNG,
        "Scaling curve": Path(curve_png),
    }
    markdown = publish_plots(
        "night-plots", plots, description="training curves, gate plots, scaling curve"
    )
    get_run_logger().info(
        "night plots: %s", ", ".join(str(p) for p in plots.values() if p.is_file())
    )
    return markdown
