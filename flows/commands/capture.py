"""``eagle3 capture`` (runs the capture flow, with a rich progress bar) and ``eagle3 vocab [--stats]`` (library)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from flows.commands.common import (
    EXIT_FAILED,
    CliError,
    ConfigOption,
    RecipeOption,
    SetOption,
    bad_input,
    console,
    print_table,
    resolve_config,
    results,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from eagle3.model.vocab import DraftVocab
    from eagle3.stage import Progress as StageProgress


def _watch(progress: Callable[[], StageProgress], stop: threading.Event) -> None:
    """Poll the features directory and draw samples done / total until ``stop`` is set."""
    columns = (TextColumn("capture"), BarColumn(), MofNCompleteColumn(), TextColumn("samples"),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        first = progress()
        task = bar.add_task("capture", total=first.total, completed=first.done)
        while not stop.wait(1.0):
            bar.update(task, completed=progress().done)
        bar.update(task, completed=progress().done)


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
        from eagle3.capture.stage import CaptureStage
        from eagle3.lineage import Lineage
        from flows.capture import capture_flow
        from flows.runners import build_task_runner, shard_placement

        cfg = resolve_config(recipe, config, set_)
        stage = CaptureStage()
        plan = stage.plan(cfg, regen_dir=Lineage(cfg).input("regen", regen_dir), shard_ids=shard_ids or None)
        console.print(f"regen {plan.regen_dir} -> features {plan.out_dir} ({len(plan.units)} shards)")
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(lambda: stage.progress(plan), stop), daemon=True)
        watcher.start()
        try:
            with shard_placement(cfg, "capture"):
                flow = capture_flow.with_options(task_runner=build_task_runner(cfg.orchestration))
                state = flow(cfg, shard_ids=list(plan.units), regen_dir=str(plan.regen_dir), return_state=True)
        finally:
            stop.set()
            watcher.join()
        if not state.is_completed():  # failed shards: the message has the list and the re-trigger command
            raise CliError(f"{state.name}: {state.message}", code=EXIT_FAILED)
        typer.echo(f"features: {state.result()}")

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
