"""``eagle3 capture`` (runs the capture flow, with a rich progress bar) and ``eagle3 vocab [--stats]`` (library)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from flows.commands.common import ConfigOption, RecipeOption, SetOption, console, resolve_config

if TYPE_CHECKING:
    from eagle3.model.vocab import DraftVocab


def _watch(plan: dict, stop: threading.Event) -> None:
    """Poll the features directory and draw samples done / total until ``stop`` is set."""
    from eagle3.capture.stage import capture_progress

    columns = (TextColumn("capture"), BarColumn(), MofNCompleteColumn(), TextColumn("samples"),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        done, total = capture_progress(plan)
        task = bar.add_task("capture", total=total, completed=done)
        while not stop.wait(1.0):
            bar.update(task, completed=capture_progress(plan)[0])
        bar.update(task, completed=capture_progress(plan)[0])


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
        from eagle3.capture.stage import CaptureInputError, plan_capture
        from flows.capture import capture_flow
        from flows.runners import build_task_runner, shard_placement

        cfg = resolve_config(recipe, config, set_)
        try:
            plan = plan_capture(cfg, regen_dir=regen_dir, shard_ids=shard_ids or None)
        except CaptureInputError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        console.print(f"regen {plan['regen_dir']} -> features {plan['features_dir']} ({len(plan['shards'])} shards)")
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(plan, stop), daemon=True)
        watcher.start()
        try:
            with shard_placement(cfg, "capture"):
                flow = capture_flow.with_options(task_runner=build_task_runner(cfg.orchestration))
                out = flow(cfg.model_dump(mode="json"), shard_ids=sorted(plan["shards"]),
                           regen_dir=plan["regen_dir"])
        finally:
            stop.set()
            watcher.join()
        console.print(f"features: {out}")

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
        from eagle3.capture.stage import CaptureInputError, find_features_dir
        from eagle3.model.vocab import load_vocab
        from eagle3.train.vocab import build_vocab_stage

        cfg = resolve_config(recipe, config, set_)
        try:
            features_dir = features or find_features_dir(cfg)
            path = build_vocab_stage(cfg, features_dir)
        except (CaptureInputError, FileNotFoundError, ValueError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        typer.echo(str(path))
        if stats:
            _print_stats(cfg.target.model_path, load_vocab(path), top)


def _print_stats(model_path: str, vocab: DraftVocab, top: int) -> None:
    from transformers import AutoTokenizer

    from eagle3.train.vocab import coverage, top_tokens

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    counts = vocab.counts
    seen = int((counts > 0).sum())
    console.print(f"draft vocab {vocab.draft_vocab_size} of {vocab.target_vocab_size} target ids; "
                  f"{seen} distinct ids seen in {int(counts.sum()):,} loss-masked tokens; "
                  f"coverage {coverage(counts, vocab):.4%}")
    table = Table("rank", "id", "token", "count", "share")
    total = max(int(counts.sum()), 1)
    for rank, (token_id, count) in enumerate(top_tokens(counts, top), start=1):
        table.add_row(str(rank), str(token_id), repr(tokenizer.decode([token_id])), f"{count:,}",
                      f"{count / total:.2%}")
    console.print(table)
