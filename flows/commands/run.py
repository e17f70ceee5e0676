"""``eagle3 run``: the whole pipeline for a recipe (the README's main command), as the ``data-scaling`` flow; and
``eagle3 plan``, which prints the night ``eagle3 run`` would plan (quick: the library, no Prefect).

The flow runs against ``PREFECT_API_URL`` when it is set (the run shows up in that server's UI), else against a
temporary API server the command starts and stops (``flows.commands.common.prefect_api``, the policy of every command
that runs a flow). Killing the command at any point and running it again resumes: finished stages are skipped
from their manifests, running shards resume from their journals. Exit code 0 when the gate passes, 1 when it
refuses the draft (the report path is printed either way) or a stage fails, 2 on a config error or damaged input,
3 when the gate is inconclusive.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

import typer

from flows.commands.common import (
    EXIT_INCONCLUSIVE,
    CliError,
    ConfigOption,
    RecipeOption,
    SetOption,
    bad_input,
    console,
    flow_result,
    prefect_api,
    resolve_config,
    results,
)

ScaleOption = typer.Option(
    None,
    "--scale",
    min=1,
    help="Grow the cumulative training set by this many prompts (default: use them all).",
)
ShardsOption = typer.Option(
    None, "--shard", help="Only these prompt shard ids (repeatable); default: planned."
)


def run(
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
    scale: int | None = ScaleOption,
    shard: list[int] | None = ShardsOption,
) -> None:
    """Run the pipeline (discover -> ... -> gate); with the tiny recipe its first task builds (or reuses) the
    tiny world."""
    from eagle3.requirements import STAGES

    # a config error exits 2 here, before Prefect starts; so does a mode whose extra is missing
    cfg = resolve_config(recipe, config, set_, stages=STAGES)
    console.print(f"run root: {cfg.root_path}")
    if cfg.dev.tiny_world:
        built = "built (or reused) by the run's first task, which logs where"
        console.print(f"{cfg.dev.world} world: {built}")
    # one INFO line per Prefect API call otherwise
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # imports while it starts
    with prefect_api(meanwhile=lambda: importlib.import_module("flows.pipeline")):
        from flows.pipeline import data_scaling

        state = data_scaling(
            recipe=str(config) if config else recipe,
            overrides=list(set_ or []),
            scale=scale,
            shard_ids=list(shard) if shard else None,
            return_state=True,
        )
        _report(state)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("plan")(plan)


def plan(
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
    scale: int | None = ScaleOption,
    prompts: Path | None = typer.Option(
        None, "--prompts", help="Prompts stage dir (default: this config's)."
    ),
) -> None:
    """Print tonight's plan, what `eagle3 run` with the same options would select, without running or selecting
    anything. Needs the prompts stage (`eagle3 normalize`). Under scaling.policy=aimed: the table of domains (pool
    left, the champion's accept length on each domain's eval prompts, traffic share, allocation, why)."""
    cfg = resolve_config(recipe, config, set_)
    from eagle3.lineage import Lineage
    from eagle3.scaling.night import plan_tonight

    prompts = Lineage(cfg).input("normalize", prompts)
    with (
        bad_input(ValueError),
        console.status("planning tonight (aimed: measuring the champion per domain, CPU)"),
    ):
        night = plan_tonight(cfg, prompts, scale, write=False)
    typer.echo(night.plan_markdown)


def _report(state: object) -> None:
    """Print where the gate report and the scaling curve are (stdout), or fail: exit 3 for an inconclusive gate (as
    ``eagle3 gate``), 1 for a refused draft or a failed stage, 2 for a stage that met damaged input."""
    from prefect.states import State

    assert isinstance(state, State)
    if state.name == "Inconclusive":
        raise CliError(f"{state.name}: {state.message}", code=EXIT_INCONCLUSIVE)
    summary = flow_result(state)  # a refused draft or a failed stage: exit 1, damaged input 2
    results.print(f"[green]gate passed[/green]: report {summary.gate.markdown}")
    results.print(f"scaling curve: {summary.curve.curve} ({summary.curve.verdict})")
