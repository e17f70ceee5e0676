"""``eagle3 vocab [--stats]``: the draft vocabulary of a features stage (or, for online training, of
the samples the online plan takes from the regen stage), built in this process (the library's
``build_vocab_stage``: one quick unit; the nightly flow runs it as the vocab flow,
``flows/vocab.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flows.commands.common import (
    ConfigOption,
    RecipeOption,
    SetOption,
    bad_input,
    print_table,
    resolve_config,
    results,
)

if TYPE_CHECKING:
    from eagle3.config.target import TargetConfig
    from eagle3.model.vocab import DraftVocab


def vocab(
    features: Path | None = typer.Option(
        None, "--features", help="Features stage dir (default: this config's)."
    ),
    stats: bool = typer.Option(
        False, "--stats", help="Print coverage and the most frequent tokens."
    ),
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
    # --features: those stored shards; else train.features decided
    source = Lineage(cfg).features(features)
    with bad_input(ValueError):  # a malformed feature shard (ids out of range, lengths differ)
        path = build_vocab_stage(cfg, source)
    typer.echo(str(path))
    if stats:
        _print_stats(cfg.target, load_vocab(path), top)


def register(app: typer.Typer) -> None:
    app.command("vocab")(vocab)


def _print_stats(target: TargetConfig, vocab: DraftVocab, top: int) -> None:
    from eagle3.target_io import load_tokenizer
    from eagle3.train.vocab import coverage, top_tokens

    tokenizer = load_tokenizer(target)
    counts = vocab.counts
    seen = int((counts > 0).sum())
    results.print(
        f"draft vocab {vocab.draft_vocab_size} of {vocab.target_vocab_size} target ids; "
        f"{seen} distinct ids seen in {int(counts.sum()):,} loss-masked tokens; "
        f"coverage {coverage(counts, vocab):.4%}"
    )
    total = max(int(counts.sum()), 1)
    rows = [
        {
            "rank": rank,
            "id": token_id,
            "token": repr(tokenizer.decode([token_id])),
            "count": f"{count:,}",
            "share": f"{count / total:.2%}",
        }
        for rank, (token_id, count) in enumerate(top_tokens(counts, top), start=1)
    ]
    print_table(f"top {top} target tokens", rows)
