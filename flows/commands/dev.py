"""``eagle3 dev build-tiny``: build (or reuse) the tiny offline world used by the tiny recipe and the tests."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.commands.common import console, results


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Developer tools: the tiny offline world.", no_args_is_help=True)

    @group.command("build-tiny")
    def build_tiny_cmd(
        cache_dir: Path | None = typer.Option(None, help="Where to cache it (default: $EAGLE3_HOME/cache)."),
    ) -> None:
        """Build the tiny world (sample datasets, BPE tokenizer, tiny Llama target); a second call is a cache hit."""
        from eagle3.dev.world import TinyWorldSpec, build_tiny_world
        from eagle3.recipes import eagle3_home

        with console.status("building the tiny world") as status:
            world, hit = build_tiny_world(cache_dir or eagle3_home() / "cache", TinyWorldSpec(),
                                          progress=lambda msg: status.update(msg))
        results.print(f"tiny world: {'cache hit' if hit else 'built'} at {world.root}")
        for key, value in world.report.items():
            results.print(f"  {key}: {value}")

    app.add_typer(group, name="dev")
