"""MLA vs MHA draft attention at matched parameters and steps: accept length on held-out prompts,
several seeds, paired by seed. Not a test: it prints numbers.

    python benchmarks/mla_vs_mha.py [--seeds 3] [--quick] [--temperature T]
        [--world tiny|domains | --model-dir DIR | --recipe NAME] [--mla-sizes Q_LORA,KV_LORA]
        [--train-prompts N] [--epochs N] [--held-out N] [--max-new N]

Arms: ``mha`` (the Llama-style head, ``train.architecture.attention=mha``) and ``mla`` (multi-head
latent attention, ``attention=mla``) whose ``q_lora_rank``/``kv_lora_rank`` are chosen so that the
whole draft's parameter count is the MHA draft's (DeepSeek-V3's ratio ``q_lora_rank = 3 x
kv_lora_rank``, the head dims ``eagle3.model.mla.mla_shape`` derives; ``--mla-sizes`` sets the two
ranks instead). Both counts are printed. Everything else is ``objectives.py``'s method: one set of
training sequences (the target's greedy answers), the same batches in the same order for the same
optimizer steps, ``train.seed`` as the seed, each draft exported and measured with the reference
speculative decoder (accept length = tokens / verify passes). Per arm the mean over seeds with its
95% t interval; MLA against MHA the paired per-seed difference and ratio with their 95% t intervals.

The world: ``--world`` (the tiny or domains dev world), ``--model-dir`` (any HF target directory,
e.g. another world's), or ``--recipe`` (the target of a recipe whose ``target.model_path`` is a
local directory). ``--temperature`` > 0 measures sampled acceptance where the reference decoder
supports it (a ``temperature`` argument); the greedy decoder refuses it with a message instead of
measuring greedy.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import tempfile
from pathlib import Path

import torch
from objectives import CPU, _intervals, _world, _world_dir, t_interval

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.gate.offline_accept import evaluate_acceptance
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder
from eagle3.train.export import export_draft
from eagle3.train.identity import load_inputs
from eagle3.train.trainer import train_on_source
from eagle3.worlds.distil import ListBatchSource

COMMON = [
    "train.precision=fp32",
    "train.device=cpu",
    "train.lr=3e-3",
    "train.batch_size=4",
    "train.log_every=5",
    "train.save_every=100000",
    "train.ttt_steps=4",
    "speculative.num_steps=3",
    "speculative.num_draft_tokens=4",
]


def draft_parameters(config: PipelineConfig, vocab: Path) -> int:
    """The trained draft's parameter count under ``config`` (the frozen target embedding is not
    one)."""
    from eagle3.model.draft import DraftModel

    return sum(p.numel() for p in DraftModel(load_inputs(config, vocab).draft_config).parameters())


def matched_mla(config: PipelineConfig, vocab: Path, budget: int) -> tuple[list[str], int]:
    """The MLA overrides (ranks ``3k``/``k``) whose draft is closest to ``budget`` parameters, and
    its count; the count is linear in ``k``, so two probes fix it."""

    def count(k: int) -> int:
        return draft_parameters(with_overrides(config, _mla(3 * k, k)), vocab)

    c1, c2 = count(1), count(2)
    k = max(1, round(1 + (budget - c1) / (c2 - c1)))
    best = min((k - 1, k, k + 1), key=lambda j: abs(count(max(j, 1)) - budget) if j > 0 else budget)
    return _mla(3 * best, best), count(best)


def _mla(q_rank: int, kv_rank: int) -> list[str]:
    return [
        "train.architecture.attention=mla",
        f"train.architecture.q_lora_rank={q_rank}",
        f"train.architecture.kv_lora_rank={kv_rank}",
    ]


def _accept(
    config: PipelineConfig,
    export: Path,
    target,
    tokenizer,
    held,
    *,
    max_new: int,
    temperature: float,
) -> float:
    decoder = SpeculativeDecoder(target, tokenizer, export, config.speculative.num_steps, "eagle3")
    kwargs = {"temperature": temperature} if temperature > 0 else {}
    stats = evaluate_acceptance(
        decoder, held, max_new_tokens=max_new, eos_ids=[tokenizer.eos_token_id], **kwargs
    )
    return stats["accept_length"]


def _arm(
    config: PipelineConfig,
    batches,
    target,
    tokenizer,
    held,
    *,
    work: Path,
    name: str,
    max_new: int,
    temperature: float,
) -> dict:
    inputs = load_inputs(config, work / "vocab.safetensors")
    summary = train_on_source(config, ListBatchSource(batches), inputs, work / name, CPU)
    export = export_draft(
        config, work / name, work / "vocab.safetensors", None, work / f"export-{name}"
    )
    accept = _accept(
        config, export, target, tokenizer, held, max_new=max_new, temperature=temperature
    )
    return {
        "accept": accept,
        "steps": summary["steps"],
        "final_loss": summary["final_loss"],
        "simulated_accept": summary["accept_length_sim"],
    }


def _ratio(runs: dict[str, list[dict]]) -> dict:
    ratios = [m["accept"] / b["accept"] for m, b in zip(runs["mla"], runs["mha"], strict=True)]
    mean, lo, hi = t_interval(ratios)
    return {
        "mla_over_mha_mean": round(mean, 4),
        "mla_over_mha_95ci": [round(lo, 4), round(hi, 4)],
        "per_seed": [round(r, 4) for r in ratios],
    }


def run(
    model_dir: Path,
    *,
    seeds: int,
    world: str,
    train_prompts: int,
    held_out: int,
    epochs: int,
    max_new: int,
    temperature: float = 0.0,
    mla_sizes: tuple[int, int] | None = None,
    label: str | None = None,
) -> dict:
    if temperature > 0 and "temperature" not in inspect.signature(evaluate_acceptance).parameters:
        raise SystemExit(
            f"--temperature {temperature}: the reference decoder verifies greedily here; "
            "sampled acceptance needs the sampled verification (evaluate_acceptance's "
            "temperature); run with --temperature 0"
        )
    work = Path(tempfile.mkdtemp(prefix="eagle3-mla-"))
    tokenizer, target, base, batches, held = _world(
        model_dir,
        kind=world,
        train_prompts=train_prompts,
        held_out=held_out,
        max_new=max_new,
        topk=None,
        work=work,
    )
    base = with_overrides(base, [*COMMON, f"train.epochs={epochs}"])
    vocab = work / "vocab.safetensors"
    mha_params = draft_parameters(base, vocab)
    if mla_sizes:
        mla_flags = _mla(*mla_sizes)
        mla_params = draft_parameters(with_overrides(base, mla_flags), vocab)
    else:
        mla_flags, mla_params = matched_mla(base, vocab, mha_params)
    arms = {"mha": [], "mla": mla_flags}
    print(
        json.dumps({"parameters": {"mha": mha_params, "mla": mla_params}, "mla": mla_flags}),
        flush=True,
    )
    runs: dict[str, list[dict]] = {}
    for seed in range(seeds):
        for arm, flags in arms.items():
            config = with_overrides(base, [*flags, f"train.seed={seed}"])
            row = _arm(
                config,
                batches,
                target,
                tokenizer,
                held,
                work=work,
                name=f"{arm}-{seed}",
                max_new=max_new,
                temperature=temperature,
            )
            runs.setdefault(arm, []).append(row)
            print(json.dumps({"arm": arm, "seed": seed, **row}), flush=True)
    gap = (mla_params - mha_params) / mha_params
    return {
        "world": label or world,
        "temperature": temperature,
        "train_prompts": train_prompts,
        "held_out": held_out,
        "epochs": epochs,
        "max_new": max_new,
        "parameters": {"mha": mha_params, "mla": mla_params, "relative_gap": round(gap, 5)},
        "mla": mla_flags,
        "summary": _intervals(runs, "mha", "accept"),
        "ratio": _ratio(runs),
        "simulated_accept": {
            a: round(statistics.fmean(r["simulated_accept"] for r in rows), 3)
            for a, rows in runs.items()
        },
    }


def _model_dir(args: argparse.Namespace) -> Path:
    if args.model_dir:
        return args.model_dir
    if args.recipe:
        from eagle3.recipes import load_recipe

        path = Path(load_recipe(args.recipe).target.model_path).expanduser()
        if not (path / "config.json").exists():
            raise SystemExit(
                f"--recipe {args.recipe}: target.model_path {path} is not a local model "
                "directory; build its world first or pass --model-dir"
            )
        return path
    return _world_dir(args.world)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer prompts and epochs")
    parser.add_argument("--world", choices=("tiny", "domains"), default="tiny")
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="HF target dir (overrides --world)"
    )
    parser.add_argument("--recipe", default=None, help="take the target dir from this recipe")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy acceptance")
    parser.add_argument(
        "--mla-sizes", default=None, help="q_lora_rank,kv_lora_rank instead of matching"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    for size in ("train-prompts", "epochs", "held-out", "max-new"):
        parser.add_argument(f"--{size}", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = (
        dict(train_prompts=32, held_out=12, epochs=3, max_new=24)
        if args.quick
        else dict(train_prompts=96, held_out=12, epochs=4, max_new=24)
    )
    sizes |= {k: v for k in sizes if (v := getattr(args, k)) is not None}
    mla_sizes = tuple(int(x) for x in args.mla_sizes.split(",")) if args.mla_sizes else None
    label = str(args.model_dir) if args.model_dir else args.recipe
    result = run(
        _model_dir(args),
        seeds=args.seeds,
        world=args.world,
        temperature=args.temperature,
        mla_sizes=mla_sizes,
        label=label,
        **sizes,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
