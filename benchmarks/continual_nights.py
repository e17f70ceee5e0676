"""Nights that build on the champion vs nights from scratch: accept length and training cost per
night.

    python benchmarks/continual_nights.py [--quick] [--seeds 0,1,2] [--nights 4] [--start 96] [--new
    24]
                                          [--replay 0.5] [--lr-scale 0.5] [--out result.json]
                                          [--resume DIR] [--threads 2] [--world tiny|domains]
                                          [--architecture-after eagle3.1] [--promote-all]

The world: the tiny world's target (``eagle3.worlds.world``), its chat/math/code prompts
(``generate_conversations``), or with ``--world domains`` the domains world
(``eagle3.worlds.domains_world``: four domains interleaved, equal shares; the eval set mixes them
alike), and their greedy answers (regen, once per seed: both arms read the same rows). Per seed (new
prompts, a new held-out eval set, a new training seed):

* night 0, shared: a draft trained from scratch on the first ``--start`` rows (its own draft vocab);
  it is the first champion of the continual arm;
* nights 1..N each add ``--new`` rows. ``scratch`` trains a fresh draft on every row so far (a new
  vocab each night, as the pipeline's vocab stage does); ``continual`` starts from its arm's
  champion with its vocab, on the rows the champion never saw plus the replay share of the rows it
  did (``eagle3.train.continual.replay_sample``), peak lr x ``--lr-scale``. Both: the project's
  trainer (``train_on_source``), ``--epochs`` epochs, batch 4, lr 3e-3 (the tiny benchmarks'
  setting);
* after each night: accept length on the held-out eval prompts (the reference speculative decoder,
  greedy, 3 steps), training tokens (the trainer's count) and training CPU-seconds
  (``time.process_time``);
* the gate's champion rule on that held-out measure (``promote``): a night's draft becomes its arm's
  champion only if its accept length is at least ``gate.min_accept`` and the lower bound of the
  ``gate.confidence`` t interval of its gain over the champion, the geometric mean over eval prompts
  of the paired per-prompt accept-length ratio, is at least ``gate.min_gain_over_champion``
  (``GateConfig`` defaults: 1.5, 0.9, 1.0), its estimate above 1 (a draft that ties the champion on
  every prompt does not beat it). The gate measures the gain as paired tok/s over rounds; accept
  length is its driver at concurrency 1, and per prompt is the pairing this benchmark has.
  ``--promote-all`` takes every night's draft as promoted (the earlier protocol).

``--architecture-after eagle3.1``: night 0 trains an EAGLE-3 draft and every later night of both
arms an EAGLE 3.1 one (``fc_norm`` + ``norm_output``): scratch from a fresh 3.1 draft, continual
from the EAGLE-3 champion's weights with the new norms at ones (``eagle3.train.continual``).

Reported: per night, mean over seeds of each arm's accept length (the night's draft and the arm's
champion after the gate), the paired difference continual - scratch with a 95% t interval over
seeds, nights promoted per arm, and continual / scratch training tokens and CPU-seconds (mean [min,
max]). The goal: the same accept length (the interval covers 0, or is above it) at <= 0.5x the
training tokens per night. ``--resume DIR`` keeps each finished seed there (``seed-<s>.json``) and
reuses it when run again with the same args.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import resumable
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle3.config.gate import GateConfig
from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.data.template import render_prompt
from eagle3.gate.stats import ratio_interval, t_quantile
from eagle3.rundir.layout import METRICS_FILE
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder
from eagle3.train.continual import replay_sample
from eagle3.train.distributed import DistInfo
from eagle3.train.export import export_draft
from eagle3.train.identity import load_inputs
from eagle3.train.metrics import read_metrics
from eagle3.train.trainer import train_on_source
from eagle3.worlds.conversations import generate_conversations
from eagle3.worlds.distil import (
    ListBatchSource,
    answer_sequences,
    batches_from_target,
    greedy_answers,
    write_draft_vocab,
)
from eagle3.worlds.world import build_tiny_world

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
ARMS = ("scratch", "continual")
STEPS = 3
ARCHITECTURES = {
    "eagle3": [],
    "eagle3.1": ["train.architecture.fc_norm=true", "train.architecture.norm_output=true"],
}


class World:
    """One seed's rows (prompt ids, answer ids) in order, keyed ``row-<k>``, and its held-out eval
    prompts."""

    def __init__(
        self, model_dir: Path, *, seed: int, rows: int, held_out: int, max_new: int, kind: str
    ) -> None:
        self.model_dir, self.seed, self.max_new = model_dir, seed, max_new
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        if kind == "domains":
            self.eos, prompts = self.tokenizer.eos_token_id, self._domain_prompts(rows + held_out)
        else:
            self.eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
            convs = generate_conversations(rows + held_out, seed=2000 + seed)
            prompts = [
                render_prompt(self.tokenizer, [c[0]] if c[0]["role"] == "user" else c[:2])
                for c in convs
            ]
        self.eval = prompts[:held_out]
        answers = greedy_answers(
            self.target,
            prompts[held_out:],
            max_new_tokens=max_new,
            eos_id=self.eos,
            pad_id=self.tokenizer.pad_token_id,
        )
        self.rows = {
            f"row-{k}": pair for k, pair in enumerate(zip(prompts[held_out:], answers, strict=True))
        }

    def _domain_prompts(self, n: int) -> list[list[int]]:
        """The domains world's four domains interleaved (equal shares; eval prompts are the first
        ``held_out``)."""
        from eagle3.worlds.domains_world import DOMAINS, domain_prompts

        per = -(-n // len(DOMAINS))
        by_domain = [
            [
                render_prompt(self.tokenizer, [c[0]])
                for c in domain_prompts(d, per, seed=1000 + self.seed)
            ]
            for d in DOMAINS
        ]
        return [p for row in zip(*by_domain, strict=True) for p in row][:n]

    def config(self, work: Path, epochs: int, lr_scale: float, flags: list[str]) -> PipelineConfig:
        hf = self.target.config
        return with_overrides(
            PipelineConfig(
                name="continual-bench",
                root=str(work),
                target=TargetConfig(
                    model_path=str(self.model_dir),
                    num_layers=hf.num_hidden_layers,
                    hidden_size=hf.hidden_size,
                    vocab_size=hf.vocab_size,
                    context_length=1024,
                    dtype="float32",
                ),
            ),
            [
                "train.precision=fp32",
                "train.device=cpu",
                "train.lr=3e-3",
                "train.batch_size=4",
                f"train.epochs={epochs}",
                f"train.seed={self.seed}",
                "train.log_every=100000",
                "train.save_every=100000",
                f"train.champion_lr_scale={lr_scale}",
                *flags,
            ],
        )

    def train(
        self,
        ids: list[str],
        work: Path,
        args: argparse.Namespace,
        *,
        champion: Path | None,
        flags: list[str] = (),
    ) -> dict:
        """A draft on rows ``ids`` (from ``champion``'s export and vocab when given), exported and
        measured."""
        config = self.config(work, args.epochs, args.lr_scale, list(flags))
        rows = [self.rows[i] for i in ids]
        random.Random(self.seed).shuffle(rows)
        sequences = answer_sequences([p for p, _ in rows], [a for _, a in rows])
        vocab = work / "vocab.safetensors"
        if champion is None:
            write_draft_vocab(
                sequences, vocab_size=config.target.vocab_size, draft_vocab_size=512, path=vocab
            )
            init = None
        else:
            from eagle3.train.continual import Start, champion_weights, write_champion_vocab

            start = Start(mode="champion", champion_dir=str(champion))
            write_champion_vocab(start, vocab)
            init = champion_weights(start)
        batches = batches_from_target(
            self.target, sequences, layer_ids=config.sglang_layer_ids, batch_size=4
        )
        cpu = time.process_time()
        train_on_source(
            config, ListBatchSource(batches), load_inputs(config, vocab), work / "d", CPU, init=init
        )
        cpu = time.process_time() - cpu
        tokens = int(read_metrics(work / "d" / METRICS_FILE)[-1]["tokens"])
        export = export_draft(config, work / "d", vocab, None, work / "export")
        decoder = SpeculativeDecoder(self.target, self.tokenizer, export, STEPS)
        wall = time.monotonic()
        # (tokens, verify passes) per eval prompt: what evaluate_acceptance sums, kept for the gate
        per_prompt = []
        for prompt in self.eval:
            decoded = decoder.generate(prompt, self.max_new, [self.eos])
            output, passes = decoded.tokens, decoded.passes
            per_prompt.append((len(output), passes))
        accept = sum(t for t, _ in per_prompt) / sum(p for _, p in per_prompt)
        return {
            "rows": len(ids),
            "tokens": tokens,
            "cpu_s": round(cpu, 2),
            "accept": accept,
            "per_prompt": per_prompt,
            "eval_s": round(time.monotonic() - wall, 1),
            "export": str(export),
        }


def run_seed(model_dir: Path, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    total = args.start + args.nights * args.new
    world = World(
        model_dir, seed=seed, rows=total, held_out=args.eval, max_new=args.max_new, kind=args.world
    )
    order = list(world.rows)
    work = Path(tempfile.mkdtemp(prefix=f"eagle3-continual-{seed}-"))
    first = world.train(order[: args.start], work / "night-0", args, champion=None)
    first |= {"seen": args.start, "promoted": True, "champion_accept": first["accept"]}
    nights: dict[str, list[dict]] = {arm: [first] for arm in ARMS}
    # each arm's champion: what it serves, and where continual starts
    champions = dict.fromkeys(ARMS, first)
    print(f"seed {seed} night 0: {first['rows']} rows, accept {first['accept']:.3f}", flush=True)
    flags = ARCHITECTURES[args.architecture_after]
    for n in range(1, args.nights + 1):
        total = args.start + n * args.new
        scratch = world.train(
            order[:total], work / f"scratch-{n}", args, champion=None, flags=flags
        )
        seen, new = (
            order[: champions["continual"]["seen"]],
            order[champions["continual"]["seen"] : total],
        )
        replayed = replay_sample(seen, len(new), args.replay, seed=seed)
        continual = world.train(
            new + replayed,
            work / f"continual-{n}",
            args,
            champion=Path(champions["continual"]["export"]),
            flags=flags,
        )
        for arm, draft in (("scratch", scratch), ("continual", continual)):
            draft["seen"], draft["gate"] = total, promote(draft, champions[arm], args.promote_all)
            draft["promoted"] = draft["gate"]["promoted"]
            champions[arm] = draft if draft["promoted"] else champions[arm]
            draft["champion_accept"] = champions[arm]["accept"]
            nights[arm].append(draft)
        print(
            f"seed {seed} night {n}: "
            + " | ".join(
                f"{arm} {d['rows']} rows {d['tokens']} tok accept {d['accept']:.3f} gain {d['gate']['gain']} "
                f"{'PROMOTED' if d['promoted'] else 'kept champion'} {d['champion_accept']:.3f}"
                for arm, d in (("scratch", scratch), ("continual", continual))
            ),
            flush=True,
        )
    return {"seed": seed, "wall_s": round(time.monotonic() - started, 1), "nights": nights}


def promote(draft: dict[str, Any], champion: dict[str, Any], promote_all: bool) -> dict[str, Any]:
    """The gate's champion rule on the held-out measure (module docstring): promoted, and the gain
    interval."""
    gate = GateConfig()
    pairs = zip(draft["per_prompt"], champion["per_prompt"], strict=True)
    ratios = [(t / p) / (ct / cp) for (t, p), (ct, cp) in pairs if t and p and ct and cp]
    iv = ratio_interval(ratios, gate.confidence)
    # a tie does not beat it
    passed = (
        iv is not None
        and iv.lo >= gate.min_gain_over_champion
        and iv.estimate > 1.0
        and draft["accept"] >= gate.min_accept
    )
    gain = None if iv is None else f"{iv.estimate:.3f} [{iv.lo:.3f}, {iv.hi:.3f}]"
    return {"promoted": promote_all or passed, "gate_pass": passed, "gain": gain}


def cached_seed(model_dir: Path, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """``run_seed``, kept in ``--resume`` (keyed by the arguments that change results) and reused
    from there."""
    names = (
        "world",
        "nights",
        "start",
        "new",
        "eval",
        "epochs",
        "replay",
        "lr_scale",
        "max_new",
        "promote_all",
        "architecture_after",
    )
    path = None if args.resume is None else args.resume / f"seed-{seed}.json"
    return resumable(
        path, {k: getattr(args, k) for k in names}, lambda: run_seed(model_dir, seed, args)
    )


def interval(values: list[float]) -> str:
    """Mean and 95% t interval over seeds."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:+.3f} (one seed)"
    half = t_quantile(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def spread(values: list[float]) -> str:
    return f"{statistics.fmean(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def summarize(results: list[dict[str, Any]], nights: int) -> list[dict[str, Any]]:
    rows = []
    for n in range(1, nights + 1):
        s = [r["nights"]["scratch"][n] for r in results]
        c = [r["nights"]["continual"][n] for r in results]
        rows.append(
            {
                "night": n,
                "scratch_accept": spread([x["accept"] for x in s]),
                "continual_accept": spread([x["accept"] for x in c]),
                "continual_minus_scratch_accept": interval(
                    [b["accept"] - a["accept"] for a, b in zip(s, c, strict=True)]
                ),
                "scratch_champion_accept": spread([x["champion_accept"] for x in s]),
                "continual_champion_accept": spread([x["champion_accept"] for x in c]),
                "champion_continual_minus_scratch": interval(
                    [b["champion_accept"] - a["champion_accept"] for a, b in zip(s, c, strict=True)]
                ),
                "promoted": {
                    "scratch": sum(x["promoted"] for x in s),
                    "continual": sum(x["promoted"] for x in c),
                    "of": len(s),
                },
                "tokens_ratio": spread(
                    [b["tokens"] / a["tokens"] for a, b in zip(s, c, strict=True)]
                ),
                "cpu_ratio": spread([b["cpu_s"] / a["cpu_s"] for a, b in zip(s, c, strict=True)]),
                "scratch_tokens": statistics.fmean(x["tokens"] for x in s),
                "continual_tokens": statistics.fmean(x["tokens"] for x in c),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 nights, smaller sets, 2 epochs")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--nights", type=int, default=None)
    parser.add_argument("--start", type=int, default=None, help="rows of night 0 (shared)")
    parser.add_argument("--new", type=int, default=None, help="new rows per night")
    parser.add_argument("--eval", type=int, default=None, help="held-out eval prompts")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument(
        "--replay", type=float, default=0.5, help="train.replay of the continual arm"
    )
    parser.add_argument(
        "--lr-scale", dest="lr_scale", type=float, default=0.5, help="train.champion_lr_scale"
    )
    parser.add_argument(
        "--max-new", dest="max_new", type=int, default=40, help="answer and eval tokens"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the full result JSON here")
    parser.add_argument(
        "--resume", type=Path, default=None, help="keep finished seeds here; reuse them"
    )
    parser.add_argument(
        "--world",
        choices=("tiny", "domains"),
        default="tiny",
        help="tiny: the tiny world's chat/math/code; domains: eagle3.worlds.domains_world, 4 domains",
    )
    parser.add_argument(
        "--architecture-after",
        dest="architecture_after",
        choices=tuple(ARCHITECTURES),
        default="eagle3",
        help="the draft architecture of nights 1..N (night 0 is EAGLE-3)",
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (one per seed process: 1)"
    )
    parser.add_argument(
        "--promote-all",
        dest="promote_all",
        action="store_true",
        help="take every night's draft as promoted (no gate; the protocol before the gate model)",
    )
    args = parser.parse_args()
    quick = dict(nights=3, start=64, new=16, eval=10, epochs=2)
    full = dict(nights=4, start=96, new=24, eval=16, epochs=3)
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    torch.set_num_threads(args.threads)
    from eagle3.recipes import eagle3_home

    if args.world == "domains":
        from eagle3.worlds.domains_world import build_domains_world

        model_dir = build_domains_world(eagle3_home() / "cache")
    else:
        model_dir = Path(build_tiny_world(eagle3_home() / "cache")[0].model_dir)
    started = time.monotonic()
    results = [cached_seed(model_dir, int(s), args) for s in str(args.seeds).split(",")]
    summary = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "wall_s": round(time.monotonic() - started, 1),
        "per_night": summarize(results, args.nights),
        "night_0_accept": spread([r["nights"]["scratch"][0]["accept"] for r in results]),
    }
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
