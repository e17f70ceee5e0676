"""``eagle3 normalize``: shows the mix plan (per source: available, weight, cap, planned) on stderr before any work
starts, runs the normalize flow (visible in the Prefect UI), and prints the per-source counts (its result) on stdout.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import typer

from flows.commands.common import (
    ConfigOption,
    RecipeOption,
    SetOption,
    console,
    prefect_api,
    print_table,
    resolve_config,
    rich_table,
    spinner,
)


def _print_plan(cfg: Any) -> None:
    from eagle3.data.discover import load_catalog
    from eagle3.data.mix import plan_table
    from eagle3.data.normalize import mix_lines
    from eagle3.data.stage import DiscoverStage
    from eagle3.stage import run_stage

    with spinner("resolving sources"):
        catalog_dir = run_stage(DiscoverStage(), cfg).out_dir
    plan = plan_table(mix_lines(cfg, load_catalog(catalog_dir)))
    total = sum(int(line["planned"]) for line in plan)
    console.print(rich_table(f"mix plan ({total:,} rows planned, seed {cfg.mix.seed})", plan))


def normalize_cmd(
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Normalize, dedup and decontaminate the sources into prompt shards (prints the mix plan first)."""
    cfg = resolve_config(recipe, config, set_)
    _print_plan(cfg)
    from eagle3.rundir.runroot import Manifest

    with (
        prefect_api(meanwhile=lambda: importlib.import_module("flows.normalize")),
        spinner("normalize"),
    ):
        from flows.normalize import prompts_flow

        out = Path(prompts_flow(cfg))
    manifest = Manifest.read(out)
    stats = manifest.stats if manifest is not None else {}
    rows = [
        {k: s[k] for k in ("source", "in", "kept", "duplicates", "quarantined")}
        for s in stats.get("sources", {}).values()
    ]
    print_table("per-source counts", rows)
    typer.echo(
        f"prompts: {out} ({stats.get('kept', 0):,} prompts in {stats.get('shards', 0)} shards)"
    )


def register(app: typer.Typer) -> None:
    app.command("normalize")(normalize_cmd)
