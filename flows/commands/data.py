"""Data commands: ``eagle3 datasets list [--json]``, ``eagle3 discover [--search ...]``, ``eagle3 normalize``.

``datasets list`` and ``discover --search`` are quick library calls. ``discover`` and ``normalize`` run their flows
(visible in the Prefect UI); ``normalize`` shows the mix plan (per source: available, weight, cap, planned) on stderr
before any work starts, and prints the per-source counts (its result) on stdout at the end.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

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
    rich_table,
)


@contextmanager
def _spinner(text: str) -> Iterator[None]:
    with Progress(SpinnerColumn(), TextColumn(text), TimeElapsedColumn(), console=console, transient=True) as bar:
        bar.add_task(text, total=None)
        yield


def _list_datasets(as_json: bool = JsonOption) -> None:
    """Print the dataset catalog: every registered adapter with its Hub id, format, license, size and tier."""
    from eagle3.data.catalog import entries, table_rows

    if as_json:  # typed values (rows as a number, domains as a list), not the table's formatted strings
        print_json([dataclasses.asdict(e) | {"tier": e.tier} for e in entries()])
        return
    print_table("dataset adapters", table_rows())


def _search(query: str, min_rows: int, licenses: str | None, limit: int) -> None:
    from eagle3.data.hub import search_hub

    wanted = [x.strip() for x in licenses.split(",")] if licenses else None
    with _spinner(f"searching the Hub for {query!r}"):  # a HubError exits 1 (the common exit-code table)
        found = search_hub(query, min_rows=min_rows, licenses=wanted, limit=limit)
    if not found:
        console.print(f"no Hub datasets match {query!r}")
        return
    print_table(f"Hub datasets matching {query!r}", found)


def _print_plan(cfg: Any) -> None:
    from eagle3.data.discover import load_catalog
    from eagle3.data.mix import plan_table
    from eagle3.data.normalize import mix_lines
    from eagle3.data.stage import DiscoverStage
    from eagle3.stage import run_stage

    with _spinner("resolving sources"):
        catalog_dir = run_stage(DiscoverStage(), cfg).out_dir
    plan = plan_table(mix_lines(cfg, load_catalog(catalog_dir)))
    total = sum(int(line["planned"]) for line in plan)
    console.print(rich_table(f"mix plan ({total:,} rows planned, seed {cfg.mix.seed})", plan))


def register(app: typer.Typer) -> None:
    datasets = typer.Typer(help="The dataset catalog.", no_args_is_help=True)
    datasets.command("list")(_list_datasets)
    app.add_typer(datasets, name="datasets")

    @app.command("discover")
    def discover_cmd(
        recipe: str = RecipeOption,
        config: Path | None = ConfigOption,
        set_: list[str] | None = SetOption,
        search: str | None = typer.Option(None, "--search", help="Search the Hub instead (e.g. 'instruct')."),
        min_rows: int = typer.Option(0, "--min-rows", help="With --search: at least this many rows."),
        license_: str | None = typer.Option(None, "--license", help="With --search: allowed licenses, a,b."),
        limit: int = typer.Option(20, "--limit", help="With --search: at most this many results."),
    ) -> None:
        """Resolve the configured sources into the catalog (revision, files, rows, format, license)."""
        if search:
            _search(search, min_rows, license_, limit)
            return
        cfg = resolve_config(recipe, config, set_)
        with prefect_api(meanwhile=lambda: importlib.import_module("flows.discover")), _spinner("discover"):
            from flows.discover import discover_flow

            out = discover_flow(cfg)
        typer.echo(f"catalog: {out}/catalog.json")

    @app.command("normalize")
    def normalize_cmd(
        recipe: str = RecipeOption, config: Path | None = ConfigOption, set_: list[str] | None = SetOption
    ) -> None:
        """Normalize, dedup and decontaminate the sources into prompt shards (prints the mix plan first)."""
        cfg = resolve_config(recipe, config, set_)
        _print_plan(cfg)
        from eagle3.rundir.runroot import Manifest

        with prefect_api(meanwhile=lambda: importlib.import_module("flows.normalize")), _spinner("normalize"):
            from flows.normalize import prompts_flow

            out = Path(prompts_flow(cfg))
        manifest = Manifest.read(out)
        stats = manifest.stats if manifest is not None else {}
        rows = [{k: s[k] for k in ("source", "in", "kept", "duplicates", "quarantined")} for s in
                stats.get("sources", {}).values()]  # fmt: skip
        print_table("per-source counts", rows)
        typer.echo(f"prompts: {out} ({stats.get('kept', 0):,} prompts in {stats.get('shards', 0)} shards)")
