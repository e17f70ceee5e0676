"""Objectives x architectures on the tiny world: {kl, lk_alpha, lk_lambda} x {EAGLE-3, EAGLE 3.1} at matched steps,
several seeds, accept length on held-out prompts with t intervals (issue 52). Not a test: it prints numbers.

    python benchmarks/objectives.py [--seeds 3] [--quick] [--losses kl,lk_lambda] [--model-dir DIR]
                                    [--train-prompts N] [--epochs N] [--held-out N] [--max-new N]

Method: one set of training sequences (the tiny target's greedy answers to generated prompts, captured once with
``batches_from_target``) and one held-out prompt set; every arm trains on the same batches in the same order for
the same number of optimizer steps (``train.epochs``), differing only in ``train.loss`` and
``train.architecture`` (EAGLE 3.1 = ``fc_norm`` + ``norm_output``). A seed is ``train.seed``: the draft's
initialisation. Each draft is exported and measured with the reference speculative decoder that ``eagle3 eval``
runs (``evaluate_acceptance``: greedy chain, ``speculative.num_steps`` 3, accept length = tokens / verify passes).
Per arm: the mean over seeds and its 95% t interval; against the baseline arm (kl, EAGLE-3) the paired per-seed
difference (same seed, same data) and its 95% t interval, which is what a default change would have to clear.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch
from learning import _default_model_dir
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.data.template import render_prompt
from eagle3.gate.offline_accept import evaluate_acceptance
from eagle3.gate.stats import t_quantile
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder
from eagle3.train.distributed import DistInfo
from eagle3.train.export import export_draft
from eagle3.train.trainer import ListBatchSource, batches_from_target, load_inputs, train_on_source
from eagle3.worlds.distil import answer_sequences, greedy_answers, write_draft_vocab
from eagle3.worlds.samples import generate_conversations

ARCHITECTURES = {"eagle3": [], "eagle3.1": ["train.architecture.fc_norm=true", "train.architecture.norm_output=true"]}
CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi) of the Student-t interval of the mean; a single value gives a zero-width interval."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = t_quantile(0.5 + confidence / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def _world(model_dir: Path, *, train_prompts: int, held_out: int, max_new: int, work: Path):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    convs = generate_conversations(train_prompts + held_out, seed=123)
    prompts = [render_prompt(tokenizer, [next(m for m in c if m["role"] == "user")]) for c in convs]
    answers = greedy_answers(target, prompts[:train_prompts], max_new_tokens=max_new, eos_id=tokenizer.eos_token_id,
                             pad_id=tokenizer.pad_token_id)
    sequences = answer_sequences(prompts[:train_prompts], answers)
    hf = target.config
    config = PipelineConfig(name="objectives", root=str(work), target=TargetConfig(
        model_path=str(model_dir), num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size,
        vocab_size=hf.vocab_size, context_length=1024, dtype="float32"))
    write_draft_vocab(sequences, vocab_size=hf.vocab_size, draft_vocab_size=min(512, hf.vocab_size),
                      path=work / "vocab.safetensors")
    batches = batches_from_target(target, sequences, layer_ids=config.sglang_layer_ids, batch_size=4)
    return tokenizer, target, config, batches, prompts[train_prompts:]


def _arm(config: PipelineConfig, batches, target, tokenizer, held, *, work: Path, name: str, max_new: int) -> dict:
    inputs = load_inputs(config, work / "vocab.safetensors")
    started = time.monotonic()
    summary = train_on_source(config, ListBatchSource(batches), inputs, work / name, CPU)
    export = export_draft(config, work / name, work / "vocab.safetensors", None, work / f"export-{name}")
    decoder = SpeculativeDecoder(target, tokenizer, export, config.speculative.num_steps, "eagle3")
    stats = evaluate_acceptance(decoder, held, max_new_tokens=max_new, eos_ids=[tokenizer.eos_token_id])
    return {"accept": stats["accept_length"], "steps": summary["steps"], "final_loss": summary["final_loss"],
            "simulated_accept": summary["accept_length_sim"], "train_s": round(time.monotonic() - started, 1)}


def run(model_dir: Path, *, seeds: int, losses: list[str], train_prompts: int, held_out: int, epochs: int,
        max_new: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="eagle3-objectives-"))
    tokenizer, target, base, batches, held = _world(model_dir, train_prompts=train_prompts, held_out=held_out,
                                                     max_new=max_new, work=work)
    common = ["train.precision=fp32", "train.device=cpu", "train.lr=3e-3", "train.batch_size=4",
              f"train.epochs={epochs}", "train.log_every=5", "train.save_every=100000", "train.ttt_steps=4",
              "speculative.num_steps=3", "speculative.num_draft_tokens=4"]
    runs: dict[str, list[dict]] = {}
    for loss in losses:
        for arch, flags in ARCHITECTURES.items():
            arm = f"{loss}/{arch}"
            for seed in range(seeds):
                config = with_overrides(base, [*common, *flags, f"train.loss={loss}", f"train.seed={seed}"])
                row = _arm(config, batches, target, tokenizer, held, work=work, name=f"{loss}-{arch}-{seed}",
                           max_new=max_new)
                runs.setdefault(arm, []).append(row)
                print(json.dumps({"arm": arm, "seed": seed, **row}), flush=True)
    baseline = runs[f"{losses[0]}/eagle3"]
    summary = {}
    for arm, rows in runs.items():
        mean, lo, hi = t_interval([r["accept"] for r in rows])
        diff = t_interval([r["accept"] - b["accept"] for r, b in zip(rows, baseline, strict=True)])
        summary[arm] = {"accept_mean": round(mean, 3), "accept_95ci": [round(lo, 3), round(hi, 3)],
                        "minus_baseline_mean": round(diff[0], 3),
                        "minus_baseline_95ci": [round(diff[1], 3), round(diff[2], 3)],
                        "steps": rows[0]["steps"], "seeds": len(rows)}
    return {"baseline": f"{losses[0]}/eagle3", "train_prompts": train_prompts, "held_out": held_out,
            "epochs": epochs, "max_new": max_new, "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--losses", default="kl,lk_alpha,lk_lambda", help="train.loss values; the first is the "
                        "baseline's")
    parser.add_argument("--quick", action="store_true", help="fewer prompts and epochs (a few minutes on 2 cores)")
    parser.add_argument("--model-dir", type=Path, default=None, help="HF target dir (default: the tiny world's)")
    for size in ("train-prompts", "epochs", "held-out", "max-new"):
        parser.add_argument(f"--{size}", type=int, default=None, help="overrides the size --quick or the default sets")
    args = parser.parse_args()
    torch.set_num_threads(2)
    sizes = dict(train_prompts=48, held_out=16, epochs=3, max_new=32) if args.quick else dict(
        train_prompts=192, held_out=32, epochs=4, max_new=48)
    sizes |= {k: v for k in sizes if (v := getattr(args, k)) is not None}
    result = run(args.model_dir or _default_model_dir(), seeds=args.seeds,
                 losses=[x for x in args.losses.split(",") if x], **sizes)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
