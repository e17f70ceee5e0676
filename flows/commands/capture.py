"""``eagle3 capture`` (runs the capture flow, with a rich progress bar) and ``eagle3 vocab [--stats]`` (library)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from eagle3.stage import Progress
from flows.commands.common import (
    ConfigOption,
    Poll,
    RecipeOption,
    SetOption,
    bad_input,
    console,
    flow_result,
    prefect_api,
    print_table,
    resolve_config,
    results,
    watch_progress,
)

if TYPE_CHECKING:
    from eagle3.model.vocab import DraftVocab


def _capture_poll(regen_dir: Path, features_dir: Path, shard_ids: list[int] | None) -> Poll:
    """``capture_progress`` of the stage for :func:`watch_progress`."""
    from eagle3.capture.stage import capture_progress

    def poll() -> tuple[Progress, str]:
        return capture_progress(regen_dir, features_dir, shard_ids=shard_ids), ""

    return poll


def register(app: typer.Typer) -> None:
    @app.command("capture")
    def capture(
        regen_dir: Path | None = typer.Option(None, "--regen-dir", help="Regen stage dir (default: this config's)."),
        shard_ids: list[int] | None = typer.Option(None, "--shard", help="Only these shard ids (repeatable)."),
        recipe: str = RecipeOption,
        config: Path | None = ConfigOption,
        set_: list[str] | None = SetOption,
    ) -> None:
        """Capture the target's hidden states for the regen shards into feature shards (a Prefect flow)."""
        from eagle3.capture.stage import features_dir_for
        from eagle3.lineage import Lineage

        cfg = resolve_config(recipe, config, set_)
        regen = Lineage(cfg).input("regen", regen_dir)
        features_dir = features_dir_for(cfg, regen)
        ids = list(shard_ids) if shard_ids else None
        console.print(f"regen {regen} -> features {features_dir}")
        with prefect_api(meanwhile=lambda: importlib.import_module("flows.capture")), \
                watch_progress("capture", _capture_poll(regen, features_dir, ids), every_s=1.0):  # fmt: skip
            from flows.capture import capture_flow

            state = capture_flow(cfg, shard_ids=ids, regen_dir=str(regen), return_state=True)
        typer.echo(f"features: {flow_result(state)}")  # failed shards: their list and the re-trigger command

    @app.command("vocab")
    def vocab(
        features: Path | None = typer.Option(None, "--features", help="Features stage dir (default: this config's)."),
        stats: bool = typer.Option(False, "--stats", help="Print coverage and the most frequent tokens."),
        top: int = typer.Option(20, help="How many top tokens --stats shows."),
        recipe: str = RecipeOption,
        config: Path | None = ConfigOption,
        set_: list[str] | None = SetOption,
    ) -> None:
        """Build the draft vocabulary (top target ids over loss-masked tokens) from a features stage."""
        from eagle3.lineage import Lineage
        from eagle3.model.vocab import load_vocab
        from eagle3.train.vocab import build_vocab_stage

        cfg = resolve_config(recipe, config, set_)
        features_dir = Lineage(cfg).input("capture", features)
        with bad_input(ValueError):  # a malformed feature shard (ids out of range, lengths differ)
            path = build_vocab_stage(cfg, features_dir)
        typer.echo(str(path))
        if stats:
            _print_stats(cfg.target.model_path, load_vocab(path), top)


def _print_stats(model_path: str, vocab: DraftVocab, top: int) -> None:
    from transformers import AutoTokenizer

    from eagle3.train.vocab import coverage, top_tokens

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    counts = vocab.counts
    seen = int((counts > 0).sum())
    results.print(f"draft vocab {vocab.draft_vocab_size} of {vocab.target_vocab_size} target ids; "
                  f"{seen} distinct ids seen in {int(counts.sum()):,} loss-masked tokens; "
                  f"coverage {coverage(counts, vocab):.4%}")
    total = max(int(counts.sum()), 1)
    rows = [
        {"rank": rank, "id": token_id, "token": repr(tokenizer.decode([token_id])), "count": f"{count:,}",
         "share": f"{count / total:.2%}"}
        for rank, (token_id, count) in enumerate(top_tokens(counts, top), start=1)
    ]
    print_table(f"top {top} target tokens", rows)
