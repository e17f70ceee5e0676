"""``eagle3 train`` (runs the train flow: torchrun workers + export, on stored or online features),
``eagle3 export`` and ``eagle3 eval`` (quick, library only)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from eagle3.config.pipeline import PipelineConfig
from eagle3.stage import Progress

if TYPE_CHECKING:
    from eagle3.capture.stage import FeatureSource
from flows.commands.common import (
    ConfigOption,
    Poll,
    RecipeOption,
    SetOption,
    bad_input,
    console,
    prefect_api,
    resolve_config,
    results,
    watch_progress,
)

FeaturesOption = typer.Option(
    None, "--features", help="Finished features stage dir (default: this config's)."
)
VocabOption = typer.Option(
    None, "--vocab", help="vocab.safetensors or its dir (default: this config's)."
)


def train(
    nproc: int | None = typer.Option(
        None, "--nproc", min=1, help="Processes (GPUs) per node (train.nproc)."
    ),
    features: Path | None = FeaturesOption,
    vocab: Path | None = VocabOption,
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Train the draft (torchrun workers when --nproc > 1), then export it for SGLang; resumes automatically."""
    overrides = [*(set_ or []), *([f"train.nproc={nproc}"] if nproc else [])]
    cfg = resolve_config(recipe, config, overrides, stages=("train", "export"))
    from eagle3.lineage import Lineage

    lineage = Lineage(cfg)
    # --features: those stored shards; else train.features decided
    source = lineage.features(features)
    vocab = lineage.input("vocab", vocab, features=source)
    with (
        prefect_api(meanwhile=lambda: importlib.import_module("flows.train")),
        watch_progress("train", _train_poll(cfg, source, vocab)),
    ):
        from flows.train import train_flow

        result = train_flow(cfg, source, str(vocab))
    results.print(f"[green]draft exported[/green]: {result.export}")


def _train_poll(cfg: PipelineConfig, features: FeatureSource, vocab: Path) -> Poll:
    """Steps done / planned from the trainer's ``metrics.jsonl`` (the train stage's progress) with the last loss
    and accept-length estimate, for :func:`watch_progress`."""
    from eagle3.train.metrics import METRICS_FILE, describe_record, read_metrics
    from eagle3.train.stage import TrainStage

    stage = TrainStage()
    plan = stage.plan(cfg, features=features, vocab=vocab)

    def poll() -> tuple[Progress, str] | None:
        records = read_metrics(plan.out_dir / METRICS_FILE)
        return (stage.progress(plan), describe_record(records[-1])) if records else None

    return poll


def export(
    draft_dir: Path = typer.Option(
        ..., "--draft-dir", help="Training output dir, its ckpt/ or a step-NNNNNN dir."
    ),
    out: Path = typer.Option(..., "--out", help="Export directory to write."),
    vocab: Path = typer.Option(..., "--vocab", help="vocab.safetensors used in training."),
    features: Path | None = typer.Option(
        None, "--features", help="Features dir (its manifest gives layer ids)."
    ),
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Write the SGLang draft directory (exact key set, validated) from a training checkpoint."""
    from eagle3.train.export import export_draft
    from eagle3.train.stage import vocab_file

    cfg = resolve_config(recipe, config, set_)
    # a checkpoint, vocab or features dir that does not make a valid export
    with bad_input(ValueError):
        path = export_draft(cfg, draft_dir, vocab_file(vocab), features, out)
    console.print(f"[green]exported[/green] {path}")


def evaluate(
    draft: Path = typer.Option(..., "--draft", "-d", help="Draft export dir."),
    prompts: Path = typer.Option(
        ...,
        "--prompts",
        "-p",
        help="A prompt set: JSONL or JSON, gzip or not ({id, prompt} rows, MT-bench's "
        "question.jsonl, HumanEval, ShareGPT-style conversations).",
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Only the first N prompts."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=1),
    aux: str = typer.Option(
        "eagle3", "--aux", help="eagle3 or last_hidden_only (the EAGLE misconfiguration)."
    ),
    temperature: float | None = typer.Option(
        None, "--temperature", min=0, help="Also at this temperature (default: the gate's)."
    ),
    top_p: float = typer.Option(1.0, "--top-p", min=0, max=1, help="With --temperature."),
    top_k: int = typer.Option(-1, "--top-k", help="With --temperature (-1: every token)."),
    seeds: int = typer.Option(2, "--seeds", min=1, help="Sampled decodes per prompt."),
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Offline acceptance: chain speculation with the HF target; prints the greedy accept length
    and, at each sampling the gate serves (or --temperature), the expected and measured accept
    length along the target's sampled continuation, each with its 90% interval over prompts."""
    import torch
    from rich.progress import Progress

    from eagle3.config.sampling import SamplingParams
    from eagle3.gate.offline_accept import evaluate_acceptance, evaluate_sampled, load_prompt_file
    from eagle3.model.export_format import validate_export
    from eagle3.serve.reference.spec_decoder import SpeculativeDecoder
    from eagle3.target_io import load_causal_lm, load_tokenizer

    # before loading the target: a broken export fails in a second
    problems = validate_export(draft)
    if problems:
        console.print(
            f"[red]error:[/red] {draft} is not a valid EAGLE-3 export:\n  " + "\n  ".join(problems)
        )
        raise typer.Exit(1)
    cfg = resolve_config(recipe, config, set_)
    with bad_input(ValueError):
        samplings = (
            [SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)]
            if temperature is not None
            else [p.params() for p in cfg.gate.sampling.values() if not p.greedy]
        )
    tokenizer = load_tokenizer(cfg.target)
    # the prompts before the target: a bad file fails at once
    prompt_ids = load_prompt_file(prompts, tokenizer, limit=limit)
    target = load_causal_lm(cfg.target, dtype=getattr(torch, cfg.target.dtype))
    decoder = SpeculativeDecoder(target, tokenizer, draft, cfg.speculative.num_steps, aux)  # type: ignore[arg-type]
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    with Progress(console=console) as progress:
        total = len(prompt_ids) * (1 + len(samplings))
        bar = progress.add_task("speculative decoding", total=total)
        options = {"max_new_tokens": max_new_tokens, "eos_ids": eos}
        options["on_prompt"] = lambda: progress.advance(bar)
        result = evaluate_acceptance(decoder, prompt_ids, **options)
        sampled = [
            evaluate_sampled(decoder, prompt_ids, s, seeds=seeds, **options) for s in samplings
        ]
    results.print(
        f"accept length {result['accept_length']:.3f} {_interval(result['interval'])} greedy "
        f"({result['tokens']} tokens / {result['verify_passes']} verify passes over "
        f"{result['prompts']} prompts, aux={aux})"
    )
    for r in sampled:
        results.print(
            f"at {r['sampling']}: expected accept length {r['expected_accept_length']:.3f} "
            f"{_interval(r['expected_interval'])}, measured {r['accept_length']:.3f} "
            f"{_interval(r['interval'])} ({r['prompts']} prompts x {r['seeds']} seeds, along the "
            "target's sampled continuation)"
        )


def _interval(interval: list[float] | None) -> str:
    return f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "[-]"


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("export")(export)
    app.command("eval")(evaluate)
