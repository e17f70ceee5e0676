"""``eagle3 dev build-tiny``: build (or reuse) the tiny offline world used by the tiny recipe and the tests."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.commands.common import CliError, console, results


def build_tiny_cmd(
    cache_dir: Path | None = typer.Option(None, help="Where to cache it (default: $EAGLE3_HOME/cache)."),
    world_name: str = typer.Option("tiny", "--world", help="tiny (chat) or think (thinking, tool-calling)."),
) -> None:
    """Build the tiny world (sample datasets, BPE tokenizer, tiny Llama target); a second call is a cache hit."""
    from eagle3.recipes import world_cache
    from eagle3.worlds.world import world_builders

    builders = world_builders()
    if world_name not in builders:
        raise CliError(f"unknown world {world_name!r}; known: {', '.join(builders)}")
    with console.status(f"building the {world_name} world") as status:
        world, hit = builders[world_name](cache_dir or world_cache(),
                                          progress=lambda msg: status.update(msg))  # fmt: skip
    results.print(f"{world_name} world: {'cache hit' if hit else 'built'} at {world.root}")
    for key, value in world.report.items():
        results.print(f"  {key}: {value}")


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Developer tools: the tiny offline world.", no_args_is_help=True)
    group.command("build-tiny")(build_tiny_cmd)
    app.add_typer(group, name="dev")
