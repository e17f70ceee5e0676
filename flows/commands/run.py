"""``eagle3 run``: the whole pipeline for a recipe (the README's main command)."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.commands.common import ConfigOption, RecipeOption, SetOption, console, resolve_config
from flows.commands.dev import build_tiny


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        recipe: str = RecipeOption,
        config: Path | None = ConfigOption,
        set_: list[str] | None = SetOption,
    ) -> None:
        """Run the pipeline for a recipe; the tiny recipe first builds (or reuses) the tiny offline world."""
        cfg = resolve_config(recipe, config, set_)
        if cfg.dev.tiny_world:
            build_tiny(Path(cfg.dev.cache_dir) if cfg.dev.cache_dir else None)
        console.print(f"run root: {cfg.root_path}")
