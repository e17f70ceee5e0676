"""``eagle3 push``: publish the run root's champion draft on the Hugging Face Hub (``eagle3.gate.publish``).

The card carries the Hub metadata, the numbers of the gate that promoted the draft and the SGLang command that
serves it; ``--dry-run`` writes the card and lists the files without uploading. Token order: ``HF_TOKEN``, then the
Prefect Secret block ``eagle3-hf-token`` (when ``PREFECT_API_URL`` names a server), then ``hf auth login``'s token.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from flows.commands.common import (
    ConfigOption,
    RecipeOption,
    SetOption,
    console,
    resolve_config,
    results,
)


def push_cmd(
    repo: str = typer.Option(..., "--repo", help="Hub repo id <owner>/<name>."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Write the card and list the files; upload nothing."
    ),
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Push the champion draft (the last one a gate promoted) to the Hub with its model card."""
    from eagle3.gate.publish import champion_upload, push

    cfg = resolve_config(recipe, config, set_)
    upload = champion_upload(cfg, repo)
    for line in upload.listing():
        results.print(line)
    if dry_run:
        console.print(f"dry run: card written to {upload.card}; nothing uploaded")
        return
    if not os.environ.get("HF_TOKEN") and os.environ.get("PREFECT_API_URL"):
        from eagle3.runtime.secrets import HF_TOKEN
        from tasks.secrets import secret_from_block

        token = secret_from_block(HF_TOKEN)
        if token:
            os.environ[HF_TOKEN] = token
    results.print(f"pushed: {push(upload)}")


def register(app: typer.Typer) -> None:
    app.command("push")(push_cmd)
