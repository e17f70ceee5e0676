"""Catalog commands: ``eagle3 datasets list [--json]`` and ``eagle3 discover [--search ...]``.

``datasets list`` and ``discover --search`` are quick library calls; ``discover`` runs its flow (visible in the
Prefect UI) and prints where the catalog is.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import typer

from flows.commands.common import (
    ConfigOption,
    JsonOption,
    RecipeOption,
    SetOption,
    console,
    prefect_api,
    print_json,
    print_table,
    resolve_config,
    spinner,
)


def _list_datasets(as_json: bool = JsonOption) -> None:
    """Print the dataset catalog: every registered adapter with its Hub id, format, license, size and tier."""
    from eagle3.data.catalog import entries, table_rows

    # typed values (rows as a number, domains as a list), not the table's formatted strings
    if as_json:
        print_json([dataclasses.asdict(e) | {"tier": e.tier} for e in entries()])
        return
    print_table("dataset adapters", table_rows())


def _search(query: str, min_rows: int, licenses: str | None, limit: int) -> None:
    from eagle3.data.hub import search_hub

    wanted = [x.strip() for x in licenses.split(",")] if licenses else None
    # a HubError exits 1 (the common exit-code table)
    with spinner(f"searching the Hub for {query!r}"):
        found = search_hub(query, min_rows=min_rows, licenses=wanted, limit=limit)
    if not found:
        console.print(f"no Hub datasets match {query!r}")
        return
    print_table(f"Hub datasets matching {query!r}", found)


def discover_cmd(
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
    search: str | None = typer.Option(
        None, "--search", help="Search the Hub instead (e.g. 'instruct')."
    ),
    min_rows: int = typer.Option(0, "--min-rows", help="With --search: at least this many rows."),
    license_: str | None = typer.Option(
        None, "--license", help="With --search: allowed licenses, a,b."
    ),
    limit: int = typer.Option(20, "--limit", help="With --search: at most this many results."),
) -> None:
    """Resolve the configured sources into the catalog (revision, files, rows, format, license)."""
    if search:
        _search(search, min_rows, license_, limit)
        return
    cfg = resolve_config(recipe, config, set_)
    with (
        prefect_api(meanwhile=lambda: importlib.import_module("flows.discover")),
        spinner("discover"),
    ):
        from flows.discover import discover_flow

        out = discover_flow(cfg)
    typer.echo(f"catalog: {out}/catalog.json")


def register(app: typer.Typer) -> None:
    datasets = typer.Typer(help="The dataset catalog.", no_args_is_help=True)
    datasets.command("list")(_list_datasets)
    app.add_typer(datasets, name="datasets")
    app.command("discover")(discover_cmd)
