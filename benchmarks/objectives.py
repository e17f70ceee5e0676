"""Objectives x architectures on a dev world: {kl, lk_alpha, lk_lambda} x {EAGLE-3, EAGLE 3.1} at
matched steps, several seeds, accept length on held-out prompts with t intervals. Not a
test: it prints numbers.

    python benchmarks/objectives.py [--seeds 3] [--quick] [--losses kl,lk_lambda] [--world
                                    tiny|domains] [--archs eagle3,eagle3.1] [--topk K] [--served
                                    ARM,ARM] [--served-seeds N] [--threads N] [--model-dir DIR]
                                    [--train-prompts N] [--epochs N] [--held-out N] [--max-new N]
                                    [--temperature T] [--top-p P] [--eval-seeds N]

``--world domains`` trains and measures on the domains world (``eagle3.worlds.domains_world``: chat,
copy, noise and recite prompts interleaved in equal shares) instead of the tiny world's
chat/math/code. ``--topk K`` gives every arm the top-K teacher the ``fp8_topk`` encoding stores (the
target's K most likely tokens, full-vocab probabilities, computed in fp32 so that only the
truncation differs from the exact teacher) instead of the exact full-vocab one. ``--served
kl/eagle3,kl/eagle3.1`` also serves those arms' exports, every seed, on real SGLang 0.5.23 on this
CPU (``infra/dev.sh sglang``) and sends it the same held-out prompts one at a time: served accept
length = completion tokens / verify passes, SGLang's own counters, beside the reference decoder's
(``--served-seeds N``: the first N seeds only; each serving starts a server).

Method: one set of training sequences (the tiny target's greedy answers to generated prompts,
captured once with ``batches_from_target``) and one held-out prompt set; every arm trains on the
same batches in the same order for the same number of optimizer steps (``train.epochs``), differing
only in ``train.loss`` and ``train.architecture`` (EAGLE 3.1 = ``fc_norm`` + ``norm_output``). A
seed is ``train.seed``: the draft's initialisation. Each draft is exported and measured with the
reference speculative decoder that ``eagle3 eval`` runs (``evaluate_acceptance``: greedy chain,
``speculative.num_steps`` 3, accept length = tokens / verify passes). Per arm: the mean over seeds
and its 95% t interval; against the baseline arm (kl, EAGLE-3) the paired per-seed difference (same
seed, same data) and its 95% t interval, which is what a default change would have to clear.

``--temperature T`` also measures every draft at that sampling (``evaluate_sampled``: the expected
accept length from the target's probability of each draft, along the target's sampled continuation,
``--eval-seeds`` decodes per prompt): the regime LK losses target, since at T > 0 a draft's
acceptance is p(draft token), not argmax agreement. The summary then has ``summary_at_t`` beside the
greedy ``summary``.
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

from eagle3.capture.head import target_topk
from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.sampling import SamplingParams
from eagle3.config.target import TargetConfig
from eagle3.data.template import render_prompt
from eagle3.gate.offline_accept import evaluate_acceptance, evaluate_sampled
from eagle3.gate.prompts import send_prompts
from eagle3.gate.stats import t_quantile
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder
from eagle3.train.distributed import DistInfo
from eagle3.train.export import export_draft
from eagle3.train.identity import load_inputs
from eagle3.train.trainer import train_on_source
from eagle3.worlds.conversations import generate_conversations
from eagle3.worlds.distil import (
    ListBatchSource,
    answer_sequences,
    batches_from_target,
    greedy_answers,
    write_draft_vocab,
)

ARCHITECTURES = {
    "eagle3": [],
    "eagle3.1": ["train.architecture.fc_norm=true", "train.architecture.norm_output=true"],
}
CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi) of the Student-t interval of the mean; a single value gives a zero-width
    interval."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = (
        t_quantile(0.5 + confidence / 2, len(values) - 1)
        * statistics.stdev(values)
        / math.sqrt(len(values))
    )
    return mean, mean - half, mean + half


def _conversations(kind: str, n: int) -> list:
    """``n`` conversations of the world ``kind``; domains: its four domains interleaved in equal
    shares."""
    if kind == "tiny":
        return generate_conversations(n, seed=123)
    from eagle3.worlds.domains_world import DOMAINS, domain_prompts

    per = -(-n // len(DOMAINS))
    by_domain = [domain_prompts(d, per, seed=123) for d in DOMAINS]
    return [c for row in zip(*by_domain, strict=True) for c in row][:n]


def _topk_teacher(batches: list[dict], lm_head: torch.Tensor, k: int) -> list[dict]:
    """The batches with the final state replaced by the target's top-``k`` (what ``fp8_topk``
    stores, in fp32)."""
    out = []
    for b in batches:
        ids, probs = target_topk(b["last_hidden"], lm_head, k)
        out.append(
            {
                **{n: v for n, v in b.items() if n != "last_hidden"},
                "target_ids": ids,
                "target_probs": probs,
            }
        )
    return out


def _world(
    model_dir: Path,
    *,
    kind: str,
    train_prompts: int,
    held_out: int,
    max_new: int,
    topk: int | None,
    work: Path,
):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    convs = _conversations(kind, train_prompts + held_out)
    prompts = [render_prompt(tokenizer, [next(m for m in c if m["role"] == "user")]) for c in convs]
    answers = greedy_answers(
        target,
        prompts[:train_prompts],
        max_new_tokens=max_new,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
    )
    sequences = answer_sequences(prompts[:train_prompts], answers)
    hf = target.config
    config = PipelineConfig(
        name="objectives",
        root=str(work),
        target=TargetConfig(
            model_path=str(model_dir),
            num_layers=hf.num_hidden_layers,
            hidden_size=hf.hidden_size,
            vocab_size=hf.vocab_size,
            context_length=1024,
            dtype="float32",
        ),
    )
    write_draft_vocab(
        sequences,
        vocab_size=hf.vocab_size,
        draft_vocab_size=min(512, hf.vocab_size),
        path=work / "vocab.safetensors",
    )
    batches = batches_from_target(
        target, sequences, layer_ids=config.sglang_layer_ids, batch_size=4
    )
    if topk is not None:
        batches = _topk_teacher(batches, target.lm_head.weight.detach(), topk)
    return tokenizer, target, config, batches, prompts[train_prompts:]


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
    sampled: tuple[SamplingParams, int] | None = None,
) -> dict:
    inputs = load_inputs(config, work / "vocab.safetensors")
    started = time.monotonic()
    summary = train_on_source(config, ListBatchSource(batches), inputs, work / name, CPU)
    export = export_draft(
        config, work / name, work / "vocab.safetensors", None, work / f"export-{name}"
    )
    decoder = SpeculativeDecoder(target, tokenizer, export, config.speculative.num_steps, "eagle3")
    stats = evaluate_acceptance(
        decoder, held, max_new_tokens=max_new, eos_ids=[tokenizer.eos_token_id]
    )
    row = {
        "accept": stats["accept_length"],
        "steps": summary["steps"],
        "final_loss": summary["final_loss"],
        "simulated_accept": summary["accept_length_sim"],
        "train_s": round(time.monotonic() - started, 1),
        "export": str(export),
    }
    if sampled is not None:
        sampling, seeds = sampled
        eos = [tokenizer.eos_token_id]
        hot = evaluate_sampled(
            decoder, held, sampling, max_new_tokens=max_new, eos_ids=eos, seeds=seeds
        )
        row["accept_t"] = hot["expected_accept_length"]
        row["accept_t_measured"] = hot["accept_length"]
    return row


def _served(config: PipelineConfig, export: Path, held, *, max_new: int, log: Path) -> float:
    """Accept length of ``export`` served by real SGLang (CPU) on ``held``, one request at a time:
    completion tokens / verify passes from SGLang's ``meta_info`` (the counters its speculative
    worker keeps)."""
    from eagle3.serve.launch_commands import build_launch

    config = with_overrides(
        config,
        [
            "server.engine=sglang",
            "server.device=cpu",
            "server.port=0",
            "server.mem_fraction_static=0.05",
            "server.max_running_requests=4",
        ],
    )
    with build_launch(config, "eagle3", draft=export, port=0).server(log_path=log) as server:
        results = send_prompts(server.url, held, concurrency=1, max_new_tokens=max_new)
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(
            f"SGLang failed {len(errors)} of {len(results)} requests, first: {errors[0]} ({log})"
        )
    return sum(r.spec.completion_tokens for r in results) / sum(r.spec.verify_ct for r in results)


def _intervals(runs: dict[str, list[dict]], baseline: str, key: str) -> dict:
    """Per arm: the mean of ``key`` over seeds with its 95% t interval, and the paired difference to
    ``baseline``."""
    summary = {}
    for arm, rows in runs.items():
        mean, lo, hi = t_interval([r[key] for r in rows])
        diff = t_interval([r[key] - b[key] for r, b in zip(rows, runs[baseline], strict=True)])
        summary[arm] = {
            "accept_mean": round(mean, 3),
            "accept_95ci": [round(lo, 3), round(hi, 3)],
            "minus_baseline_mean": round(diff[0], 3),
            "minus_baseline_95ci": [round(diff[1], 3), round(diff[2], 3)],
            "steps": rows[0]["steps"],
            "seeds": len(rows),
        }
    return summary


def run(
    model_dir: Path,
    *,
    seeds: int,
    losses: list[str],
    train_prompts: int,
    held_out: int,
    epochs: int,
    max_new: int,
    world: str = "tiny",
    topk: int | None = None,
    served: list[str] = (),
    served_seeds: int | None = None,
    archs: list[str] = tuple(ARCHITECTURES),
    sampled: tuple[SamplingParams, int] | None = None,
) -> dict:
    work = Path(tempfile.mkdtemp(prefix="eagle3-objectives-"))
    tokenizer, target, base, batches, held = _world(
        model_dir,
        kind=world,
        train_prompts=train_prompts,
        held_out=held_out,
        max_new=max_new,
        topk=topk,
        work=work,
    )
    common = [
        "train.precision=fp32",
        "train.device=cpu",
        "train.lr=3e-3",
        "train.batch_size=4",
        f"train.epochs={epochs}",
        "train.log_every=5",
        "train.save_every=100000",
        "train.ttt_steps=4",
        "speculative.num_steps=3",
        "speculative.num_draft_tokens=4",
    ]
    runs: dict[str, list[dict]] = {}
    for loss in losses:
        for arch in archs:
            flags = ARCHITECTURES[arch]
            arm = f"{loss}/{arch}"
            for seed in range(seeds):
                config = with_overrides(
                    base, [*common, *flags, f"train.loss={loss}", f"train.seed={seed}"]
                )
                row = _arm(
                    config,
                    batches,
                    target,
                    tokenizer,
                    held,
                    work=work,
                    name=f"{loss}-{arch}-{seed}",
                    max_new=max_new,
                    sampled=sampled,
                )
                runs.setdefault(arm, []).append(row)
                print(json.dumps({"arm": arm, "seed": seed, **row}), flush=True)
    baseline = f"{losses[0]}/{archs[0]}"
    for arm in served:
        for seed, row in enumerate(runs[arm][:served_seeds]):
            row["served"] = _served(
                base,
                Path(row["export"]),
                held,
                max_new=max_new,
                log=work / f"sglang-{arm.replace('/', '-')}-{seed}.log",
            )
            print(
                json.dumps(
                    {"arm": arm, "seed": seed, "served": row["served"], "accept": row["accept"]}
                ),
                flush=True,
            )
    result = {
        "world": world,
        "teacher": f"top-{topk}" if topk else "exact",
        "baseline": baseline,
        "train_prompts": train_prompts,
        "held_out": held_out,
        "epochs": epochs,
        "max_new": max_new,
        "summary": _intervals(runs, baseline, "accept"),
    }
    if served:
        result["served"] = _intervals(
            {a: runs[a][:served_seeds] for a in served}, served[0], "served"
        )
    if sampled is not None:
        result["at_t"] = {"sampling": sampled[0].label(), "eval_seeds": sampled[1]}
        result["summary_at_t"] = _intervals(runs, baseline, "accept_t")
    return result


def _world_dir(kind: str) -> Path:
    if kind == "tiny":
        return _default_model_dir()
    from eagle3.recipes import world_cache
    from eagle3.worlds.domains_world import build_domains_world

    return build_domains_world(world_cache())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--losses",
        default="kl,lk_alpha,lk_lambda",
        help="train.loss values; the first is the baseline's",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer prompts and epochs (a few minutes on 2 cores)"
    )
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="HF target dir (default: the world's)"
    )
    parser.add_argument("--world", choices=("tiny", "domains"), default="tiny")
    parser.add_argument(
        "--topk",
        type=int,
        default=None,
        help="train on the target's top-K teacher (fp8_topk's), not the exact one",
    )
    parser.add_argument(
        "--archs", default=",".join(ARCHITECTURES), help="draft architectures, eagle3 first"
    )
    parser.add_argument(
        "--served-seeds", type=int, default=None, help="serve only the first N seeds' drafts"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument(
        "--served",
        default="",
        help="arms served by real SGLang too, e.g. kl/eagle3,kl/eagle3.1; "
        "the first is the served baseline",
    )
    parser.add_argument("--temperature", type=float, default=None, help="also evaluate at this T")
    parser.add_argument("--top-p", type=float, default=1.0, help="with --temperature")
    parser.add_argument("--eval-seeds", type=int, default=2, help="sampled decodes per prompt")
    for size in ("train-prompts", "epochs", "held-out", "max-new"):
        parser.add_argument(
            f"--{size}",
            type=int,
            default=None,
            help="overrides the size --quick or the default sets",
        )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = (
        dict(train_prompts=48, held_out=16, epochs=3, max_new=32)
        if args.quick
        else dict(train_prompts=192, held_out=32, epochs=4, max_new=48)
    )
    sizes |= {k: v for k in sizes if (v := getattr(args, k)) is not None}
    sampled = None
    if args.temperature is not None:
        sampled = (SamplingParams(temperature=args.temperature, top_p=args.top_p), args.eval_seeds)
    result = run(
        args.model_dir or _world_dir(args.world),
        seeds=args.seeds,
        world=args.world,
        topk=args.topk,
        losses=[x for x in args.losses.split(",") if x],
        served=[x for x in args.served.split(",") if x],
        served_seeds=args.served_seeds,
        archs=[x for x in args.archs.split(",") if x],
        sampled=sampled,
        **sizes,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
