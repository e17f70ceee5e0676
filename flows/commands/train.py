"""``eagle3 train`` (runs the train flow: torchrun workers + export), ``eagle3 export`` and ``eagle3 eval``
(quick, library only)."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.commands.common import ConfigOption, RecipeOption, SetOption, console, resolve_config

FeaturesOption = typer.Option(None, "--features", help="Finished features stage dir (default: newest in the run root).")
VocabOption = typer.Option(None, "--vocab", help="vocab.safetensors or its dir (default: newest in the run root).")


def _newest(root: Path, stage: str, marker: str) -> Path:
    """The most recently finished stage directory holding ``marker``; exits 2 with a hint when there is none."""
    found = sorted((p for p in (root / stage).glob("*") if (p / marker).exists()), key=lambda p: p.stat().st_mtime)
    if not found:
        console.print(f"[red]error:[/red] no finished {stage} stage under {root}: run `eagle3 run` first or pass "
                      f"--{stage.rstrip('s')}")
        raise typer.Exit(2)
    return found[-1]


def train(
    nproc: int | None = typer.Option(None, "--nproc", min=1, help="Processes (GPUs) per node (train.nproc)."),
    features: Path | None = FeaturesOption,
    vocab: Path | None = VocabOption,
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Train the draft (torchrun workers when --nproc > 1), then export it for SGLang; resumes automatically."""
    overrides = [*(set_ or []), *([f"train.nproc={nproc}"] if nproc else [])]
    cfg = resolve_config(recipe, config, overrides)
    features = features or _newest(cfg.root_path, "features", "manifest.json")
    vocab = vocab or _newest(cfg.root_path, "vocab", "vocab.safetensors")
    from flows.train import train_flow

    result = train_flow(cfg.model_dump(mode="json"), str(features), str(vocab))
    console.print(f"[green]draft exported[/green]: {result['export']}")


def export(
    draft_dir: Path = typer.Option(..., "--draft-dir", help="Training output dir, its ckpt/ or a step-NNNNNN dir."),
    out: Path = typer.Option(..., "--out", help="Export directory to write."),
    vocab: Path = typer.Option(..., "--vocab", help="vocab.safetensors used in training."),
    features: Path | None = typer.Option(None, "--features", help="Features dir (its manifest gives layer ids)."),
    push_to_hub: str | None = typer.Option(None, "--push-to-hub", help="Hub repo id (token from HF_TOKEN)."),
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Write the SGLang draft directory (exact key set, validated) from a training checkpoint."""
    from eagle3.model.export import export_draft

    overrides = [*(set_ or []), *([f"export.push_to_hub={push_to_hub}"] if push_to_hub else [])]
    cfg = resolve_config(recipe, config, overrides)
    vocab_file = vocab / "vocab.safetensors" if vocab.is_dir() else vocab
    try:
        path = export_draft(cfg, draft_dir, vocab_file, features, out)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    console.print(f"[green]exported[/green] {path}")


def evaluate(
    draft: Path = typer.Option(..., "--draft", "-d", help="Draft export dir."),
    prompts: Path = typer.Option(..., "--prompts", "-p", help='JSONL of {"id", "prompt"} rows.'),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Only the first N prompts."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=1),
    aux: str = typer.Option("eagle3", "--aux", help="eagle3 or last_hidden_only (the EAGLE misconfiguration)."),
    recipe: str = RecipeOption,
    config: Path | None = ConfigOption,
    set_: list[str] | None = SetOption,
) -> None:
    """Offline acceptance: greedy chain speculation with the HF target; prints accept length."""
    import torch
    from rich.progress import Progress
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3.bench.specdec import load_prompt_file
    from eagle3.serve.specdec import SpeculativeDecoder

    cfg = resolve_config(recipe, config, set_)
    target_path = cfg.target.model_path
    tokenizer = AutoTokenizer.from_pretrained(target_path, revision=cfg.target.revision)
    target = AutoModelForCausalLM.from_pretrained(target_path, revision=cfg.target.revision,
                                                  dtype=getattr(torch, cfg.target.dtype))
    decoder = SpeculativeDecoder(target, tokenizer, draft, cfg.speculative.num_steps, aux)  # type: ignore[arg-type]
    prompt_ids = load_prompt_file(prompts, tokenizer, limit=limit)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    tokens = passes = 0
    with Progress(console=console) as progress:
        bar = progress.add_task("speculative decoding", total=len(prompt_ids))
        for ids in prompt_ids:
            out, verify = decoder.generate(ids, max_new_tokens, eos)
            tokens, passes = tokens + len(out), passes + verify
            progress.advance(bar)
    accept = tokens / passes if passes else float("nan")
    console.print(f"accept length {accept:.3f} ({tokens} tokens / {passes} verify passes, aux={aux})")


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("export")(export)
    app.command("eval")(evaluate)
