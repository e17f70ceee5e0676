"""``eagle3 config show``: print the resolved config (recipe + overrides) as YAML."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from flows.commands.common import ConfigOption, RecipeOption, SetOption, resolve_config


def show(
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Print the resolved config as YAML, then the values derived from it (aux layer ids, the feature disk one
    night of the mix needs per capture encoding before Parquet compression, and with capture.backend=sglang the
    memory plan per GPU: served weights plus capture buffers)."""
    from eagle3.capture.budget import night_estimate
    from eagle3.capture.costs import cost_table
    from eagle3.capture.footprint import served_plan

    cfg = resolve_config(recipe, config, set_)
    typer.echo(cfg.to_yaml(), nl=False)
    typer.echo("# derived (not read back):")
    derived = {**cfg.derived(), "capture_disk_per_night": night_estimate(cfg)}
    derived["features_stored_vs_online"] = cost_table(cfg)  # what train.features weighs
    if cfg.capture.backend == "sglang":
        derived["capture_memory_per_gpu"] = served_plan(cfg).describe()
    for line in yaml.safe_dump(derived, sort_keys=False, default_flow_style=None).splitlines():
        typer.echo(f"# {line}")


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Inspect the resolved pipeline config.", no_args_is_help=True)
    group.command("show")(show)
    app.add_typer(group, name="config")
