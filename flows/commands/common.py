"""Pieces every command module shares: the console, recipe options, config loading with readable errors."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from eagle3.config import ConfigError, PipelineConfig, load_yaml
from eagle3.recipes import load_recipe

console = Console(stderr=True)

RecipeOption = typer.Option("tiny", "--recipe", "-r", help="Named recipe (tiny, llama3_8b, kimi_k2_5).")
ConfigOption = typer.Option(None, "--config", "-c", help="A YAML config file instead of a recipe.")
SetOption = typer.Option(None, "--set", "-s", help="Override a config value: --set train.lr=2e-4 (repeatable).")


def resolve_config(recipe: str, config: Path | None, overrides: list[str] | None) -> PipelineConfig:
    """The config from a YAML file or a recipe, with overrides; a config error exits 2 with its message."""
    try:
        if config is not None:
            return load_yaml(config, overrides or [])
        return load_recipe(recipe, overrides or [])
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
