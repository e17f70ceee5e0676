"""``eagle3 capture``: runs the capture flow, with a rich progress bar."""

from __future__ import annotations

import importlib
from pathlib import Path

import typer

from eagle3.stage import Progress
from flows.commands.common import (
    ConfigOption,
    Poll,
    RecipeOption,
    SetOption,
    console,
    flow_result,
    prefect_api,
    resolve_config,
    watch_progress,
)


def _capture_poll(regen_dir: Path, features_dir: Path, shard_ids: list[int] | None) -> Poll:
    """``capture_progress`` of the stage for :func:`watch_progress`."""
    from eagle3.capture.stage import capture_progress

    def poll() -> tuple[Progress, str]:
        return capture_progress(regen_dir, features_dir, shard_ids=shard_ids), ""

    return poll


def capture(
    regen_dir: Path | None = typer.Option(
        None, "--regen-dir", help="Regen stage dir (default: this config's)."
    ),
    shard_ids: list[int] | None = typer.Option(
        None, "--shard", help="Only these shard ids (repeatable)."
    ),
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Capture the target's hidden states for the regen shards into feature shards (a Prefect flow)."""
    from eagle3.capture.stage import features_dir_for
    from eagle3.lineage import Lineage

    cfg = resolve_config(recipe, config, set_, stages=("capture",))
    regen = Lineage(cfg).input("regen", regen_dir)
    features_dir = features_dir_for(cfg, regen)
    ids = list(shard_ids) if shard_ids else None
    console.print(f"regen {regen} -> features {features_dir}")
    with (
        prefect_api(meanwhile=lambda: importlib.import_module("flows.capture")),
        watch_progress("capture", _capture_poll(regen, features_dir, ids), every_s=1.0),
    ):
        from flows.capture import capture_flow

        state = capture_flow(cfg, shard_ids=ids, regen_dir=str(regen), return_state=True)
    source = flow_result(state)  # failed shards: their list and the re-trigger command
    typer.echo(f"features: {source.shards_dir or 'none captured: ' + source.why}")


def register(app: typer.Typer) -> None:
    app.command("capture")(capture)
