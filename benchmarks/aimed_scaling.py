"""Aimed vs uniform data scaling: from the same start, N nights of each policy with the same
regenerated- token budget per night; after each night the serving-mix accept length on the same
held-out eval set; several seeds.

    python benchmarks/aimed_scaling.py [--quick] [--seeds 0,1,2] [--nights 4] [--budget 1600] [--out
    result.json]
                                       [--init scratch|champion] [--replay 0.5] [--lr-scale 0.5]
                                       [--max-share 1]

The world (``eagle3.worlds.domains_world``): a tiny target trained on four domains whose answers a
draft learns in different ways (memorized passages that saturate fast, copying that keeps improving
with data, high-entropy codes no draft predicts, templated chat), each domain an equal share of the
serving traffic. Per seed (new prompts, a new held-out eval set, a new training seed):

* the pool: ``--pool`` prompts per domain, ``--eval`` more held out per domain; the target's greedy
  answers to every pool prompt (regen, once: both policies read the same answers for a row);
* night 0, the start both policies share: the first ``--start`` rows of the pool's interleaved
  order;
* nights 1..N, each ``--budget`` regenerated tokens: ``uniform`` takes the next rows of the pool's
  interleaved order (the pipeline's uniform rule, which walks the prompts stage's interleaved
  shards) while they fit; ``aimed`` asks the pipeline's rule
  (``eagle3.scaling.allocation.allocate``, the ``scaling`` default floor 0.1) with what the pipeline
  would know: rows left per domain, tokens per row of the rows regenerated so far, the current
  draft's accept length per domain, and the per-domain (tokens, accept length) points of the earlier
  nights;
* each night a fresh draft is trained on every row selected so far (the project's trainer, fixed
  epochs, the night's draft vocab), then measured per domain on the eval set (the reference
  speculative decoder, greedy, 3 steps);
* with ``--init champion`` (aimed v2's setting) a night instead starts from the policy's previous
  draft (every night's draft taken as promoted) with its vocab, on the night's new rows plus the
  replay share of the rows before (``eagle3.train.continual.replay_sample`` over ``domain:row``
  ids), peak lr x ``--lr-scale``; aimed passes ``--max-share`` as ``scaling.max_domain_share``.

Reported per seed and as mean [min, max] over seeds: the regenerated tokens (after the start) aimed
needs to reach uniform's final serving-mix accept length, relative to uniform's (goal <= 0.7; linear
between nights, "not reached" if aimed never gets there), and the accept lengths at equal tokens
(both policies after the last night: each policy's mean and the paired difference aimed - uniform
with 95% t intervals over seeds).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
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

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.scaling import ScalingConfig
from eagle3.config.target import TargetConfig
from eagle3.data.template import render_prompt
from eagle3.gate.offline_accept import evaluate_acceptance
from eagle3.gate.stats import t_quantile
from eagle3.scaling.allocation import DomainState, allocate
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder
from eagle3.train.continual import Start, champion_weights, replay_sample, write_champion_vocab
from eagle3.train.distributed import DistInfo
from eagle3.train.export import export_draft
from eagle3.train.identity import load_inputs
from eagle3.train.trainer import train_on_source
from eagle3.worlds.distil import (
    ListBatchSource,
    answer_sequences,
    batches_from_target,
    greedy_answers,
    write_draft_vocab,
)
from eagle3.worlds.domains_world import DOMAINS, build_domains_world, domain_prompts

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
POLICIES = ("uniform", "aimed")
PER_SEED = (
    "seed",
    "ratio",
    "uniform_final_accept",
    "aimed_final_accept",
    "uniform_tokens",
    "aimed_tokens",
    "wall_s",
)


class World:
    """One seed's pool: per domain the rows (prompt ids, answer ids) in order, the eval prompts, the
    target."""

    def __init__(
        self, model_dir: Path, *, seed: int, pool: int, held_out: int, max_new: int
    ) -> None:
        self.model_dir, self.seed, self.max_new = model_dir, seed, max_new
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.eos = self.tokenizer.eos_token_id
        rng = random.Random(seed)
        self.rows: dict[str, list[tuple[list[int], list[int]]]] = {}
        self.eval: dict[str, list[list[int]]] = {}
        for domain in DOMAINS:
            convs = domain_prompts(domain, pool + held_out, seed=1000 + seed)
            rng.shuffle(convs)
            prompts = [render_prompt(self.tokenizer, [c[0]]) for c in convs]
            self.eval[domain] = prompts[:held_out]
            answers = greedy_answers(
                self.target,
                prompts[held_out:],
                max_new_tokens=max_new,
                eos_id=self.eos,
                pad_id=self.tokenizer.pad_token_id,
            )
            self.rows[domain] = list(zip(prompts[held_out:], answers, strict=True))

    def interleaved(self) -> list[tuple[str, int]]:
        """(domain, row) in the prompts stage's order: domains interleaved in proportion to their
        sizes."""
        sizes = {d: len(rows) for d, rows in self.rows.items()}
        heap, out, taken = (
            [(1 / n, d) for d, n in sorted(sizes.items())],
            [],
            dict.fromkeys(sizes, 0),
        )
        heapq.heapify(heap)
        while heap:
            _, d = heapq.heappop(heap)
            out.append((d, taken[d]))
            taken[d] += 1
            if taken[d] < sizes[d]:
                heapq.heappush(heap, ((taken[d] + 1) / sizes[d], d))
        return out

    def tokens(self, domain: str, row: int) -> int:
        return len(self.rows[domain][row][1])


class Run:
    """One policy's nights over a world: what it selected (rows per domain, taken in pool order) and
    measured."""

    def __init__(
        self, world: World, policy: str, start: dict[str, int], work: Path, args: argparse.Namespace
    ):
        self.world, self.policy, self.work, self.args = world, policy, work, args
        self.taken = dict(start)
        self.nights: list[dict[str, Any]] = []
        self.export: Path | None = None  # the last night's draft (--init champion: tonight's start)
        self.cursor = sum(start.values())  # uniform: the next position in the interleaved order

    def domain_tokens(self) -> dict[str, int]:
        return {d: sum(self.world.tokens(d, r) for r in range(n)) for d, n in self.taken.items()}

    def select(self, budget: int) -> dict[str, int]:
        return self._uniform(budget) if self.policy == "uniform" else self._aimed(budget)

    def _uniform(self, budget: int) -> dict[str, int]:
        order, spent, rows = self.world.interleaved(), 0, dict.fromkeys(DOMAINS, 0)
        while self.cursor < len(order):
            domain, row = order[self.cursor]
            if spent + self.world.tokens(domain, row) > budget:
                break
            spent += self.world.tokens(domain, row)
            rows[domain] += 1
            self.cursor += 1
        return rows

    def _aimed(self, budget: int) -> dict[str, int]:
        scaling, tokens, last = ScalingConfig(), self.domain_tokens(), self.nights[-1]["by_domain"]
        states = [
            DomainState(
                name=d,
                pool_left=len(self.world.rows[d]) - self.taken[d],
                tokens_per_row=tokens[d] / max(self.taken[d], 1),
                share=1 / len(DOMAINS),
                accept=last[d],
                trained_tokens=tokens[d],
                points=tuple((n["tokens_by_domain"][d], n["by_domain"][d]) for n in self.nights),
            )
            for d in DOMAINS
        ]
        plan = allocate(
            states,
            budget,
            unit="tokens",
            floor=scaling.floor,
            ceiling=self.args.steps + 1,
            max_share=self.args.max_share,
        )
        return plan.rows()

    def night(self, index: int, added: dict[str, int]) -> dict[str, Any]:
        before = dict(self.taken)
        for domain, n in added.items():
            self.taken[domain] += n
        ids = [(d, r) for d in DOMAINS for r in range(self.taken[d])]
        champion = self.export if self.args.init == "champion" else None
        if champion is not None:
            new = [(d, r) for d in DOMAINS for r in range(before[d], self.taken[d])]
            seen = [f"{d}:{r}" for d in DOMAINS for r in range(before[d])]
            replayed = replay_sample(seen, len(new), self.args.replay, seed=self.world.seed)
            ids = new + [(sid.split(":")[0], int(sid.split(":")[1])) for sid in replayed]
        work = self.work / f"{self.policy}-{index}"
        by_domain, self.export = train_and_measure(
            self.world, ids, work, self.args, champion=champion
        )
        tokens = self.domain_tokens()
        record = {
            "night": index,
            "rows": dict(self.taken),
            "added": added,
            "tokens_by_domain": tokens,
            "tokens": sum(tokens.values()),
            "by_domain": by_domain,
            "accept": statistics.fmean(by_domain.values()),
        }  # equal traffic shares
        self.nights.append(record)
        accepts = {d: round(a, 2) for d, a in by_domain.items()}
        print(
            f"  {self.policy:7s} night {index}: +{added} -> {record['tokens']} tokens, accept "
            f"{record['accept']:.3f} {accepts}",
            flush=True,
        )
        return record


def train_and_measure(
    world: World,
    ids: list[tuple[str, int]],
    work: Path,
    args: argparse.Namespace,
    *,
    champion: Path | None = None,
) -> tuple[dict[str, float], Path]:
    """A draft on rows ``ids`` (domain, row): fresh with its own draft vocab, or from ``champion``'s
    export and vocab; then its accept length per domain, and its export."""
    hf = world.target.config
    config = with_overrides(
        PipelineConfig(
            name="aimed-bench",
            root=str(work),
            target=TargetConfig(
                model_path=str(world.model_dir),
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
            f"train.epochs={args.epochs}",
            f"train.seed={world.seed}",
            "train.log_every=1000",
            "train.save_every=100000",
            f"speculative.num_steps={args.steps}",
            f"speculative.num_draft_tokens={args.steps + 1}",
            f"train.champion_lr_scale={args.lr_scale}",
        ],
    )
    rows = [world.rows[d][r] for d, r in ids]
    random.Random(world.seed).shuffle(rows)
    sequences = answer_sequences([p for p, _ in rows], [a for _, a in rows])
    vocab, init = work / "vocab.safetensors", None
    if champion is None:
        write_draft_vocab(sequences, vocab_size=hf.vocab_size, draft_vocab_size=512, path=vocab)
    else:
        start = Start(mode="champion", champion_dir=str(champion))
        write_champion_vocab(start, vocab)
        init = champion_weights(start)
    batches = batches_from_target(
        world.target, sequences, layer_ids=config.sglang_layer_ids, batch_size=4
    )
    train_on_source(
        config, ListBatchSource(batches), load_inputs(config, vocab), work / "d", CPU, init=init
    )
    export = export_draft(config, work / "d", vocab, None, work / "export")
    decoder = SpeculativeDecoder(world.target, world.tokenizer, export, args.steps)
    return {
        d: evaluate_acceptance(
            decoder, world.eval[d], max_new_tokens=world.max_new, eos_ids=[world.eos]
        )["accept_length"]
        for d in DOMAINS
    }, export


def tokens_to_reach(curve: list[dict[str, Any]], goal: float) -> float | None:
    """Tokens after the start at which ``curve`` first reaches ``goal`` accept length (linear
    between nights)."""
    base = curve[0]["tokens"]
    for before, after in itertools.pairwise(curve):
        if after["accept"] >= goal:
            if before["accept"] >= goal:
                return before["tokens"] - base
            frac = (goal - before["accept"]) / (after["accept"] - before["accept"])
            return before["tokens"] - base + frac * (after["tokens"] - before["tokens"])
    return None


def seed_world(
    model_dir: Path, seed: int, args: argparse.Namespace
) -> tuple[World, dict[str, int]]:
    """One seed's world and the rows per domain of the start every policy shares (night 0)."""
    world = World(model_dir, seed=seed, pool=args.pool, held_out=args.eval, max_new=args.max_new)
    start = dict.fromkeys(DOMAINS, 0)
    for domain, _row in world.interleaved()[: args.start]:
        start[domain] += 1
    return world, start


def run_seed(model_dir: Path, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    world, start = seed_world(model_dir, seed, args)
    work = Path(tempfile.mkdtemp(prefix=f"eagle3-aimed-{seed}-"))
    runs = {p: Run(world, p, start, work, args) for p in POLICIES}
    print(f"seed {seed}: start {start}", flush=True)
    first = runs["uniform"].night(0, dict.fromkeys(DOMAINS, 0))
    runs["aimed"].nights.append(first)  # the same start: one draft, measured once
    runs["aimed"].export = runs["uniform"].export
    for index in range(1, args.nights + 1):
        for run in runs.values():
            run.night(index, run.select(args.budget))
    uniform, aimed = runs["uniform"].nights, runs["aimed"].nights
    goal, spent = uniform[-1]["accept"], uniform[-1]["tokens"] - uniform[0]["tokens"]
    needed = tokens_to_reach(aimed, goal)
    return {
        "seed": seed,
        "wall_s": round(time.monotonic() - started, 1),
        "uniform": uniform,
        "aimed": aimed,
        "uniform_final_accept": goal,
        "aimed_final_accept": aimed[-1]["accept"],
        "uniform_tokens": spent,
        "aimed_tokens": aimed[-1]["tokens"] - aimed[0]["tokens"],
        "aimed_tokens_to_reach": needed,
        "ratio": None if needed is None else needed / spent,
    }


def spread(values: list[float]) -> str:
    return (
        f"{statistics.fmean(values):.3f} [{min(values):.3f}, {max(values):.3f}]"
        if values
        else "n/a"
    )


def interval(values: list[float], *, sign: str = "+") -> str:
    """Mean and 95% t interval over seeds (``sign="+"``: a paired difference; ``""``: a level)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:{sign}.3f} (one seed)"
    half = t_quantile(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return f"{mean:{sign}.3f} [{mean - half:{sign}.3f}, {mean + half:{sign}.3f}]"


def cached_seed(model_dir: Path, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """``run_seed``, kept in ``--resume`` (keyed by the arguments that change results) and reused
    from there."""
    names = (
        "nights",
        "pool",
        "eval",
        "start",
        "budget",
        "epochs",
        "max_new",
        "init",
        "replay",
        "lr_scale",
        "max_share",
    )
    path = None if args.resume is None else args.resume / f"seed-{seed}.json"
    return resumable(
        path, {k: getattr(args, k) for k in names}, lambda: run_seed(model_dir, seed, args)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="2 seeds, 3 nights, smaller sets (~1/4 of the time)"
    )
    parser.add_argument(
        "--seeds", default=None, help="comma-separated seeds (default 0,1,2; --quick 0,1)"
    )
    parser.add_argument("--nights", type=int, default=None)
    parser.add_argument("--pool", type=int, default=None, help="pool prompts per domain")
    parser.add_argument("--eval", type=int, default=None, help="held-out eval prompts per domain")
    parser.add_argument(
        "--start", type=int, default=None, help="rows of the shared start (night 0)"
    )
    parser.add_argument("--budget", type=int, default=None, help="regenerated tokens per night")
    parser.add_argument(
        "--epochs", type=int, default=None, help="training epochs of every night's draft"
    )
    parser.add_argument(
        "--max-new", dest="max_new", type=int, default=None, help="answer and eval tokens"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the full result JSON here")
    parser.add_argument(
        "--resume", type=Path, default=None, help="keep finished seeds here; reuse them"
    )
    parser.add_argument(
        "--init",
        choices=("scratch", "champion"),
        default="scratch",
        help="scratch: a fresh draft each night; champion: from the policy's last draft",
    )
    parser.add_argument("--replay", type=float, default=0.5, help="--init champion: train.replay")
    parser.add_argument(
        "--lr-scale", dest="lr_scale", type=float, default=0.5, help="train.champion_lr_scale"
    )
    parser.add_argument(
        "--max-share", dest="max_share", type=float, default=1.0, help="scaling.max_domain_share"
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (one per seed process: 1)"
    )
    args = parser.parse_args()
    quick = dict(
        seeds="0,1", nights=3, pool=160, eval=8, start=32, budget=1200, epochs=3, max_new=48
    )
    full = dict(
        seeds="0,1,2", nights=4, pool=240, eval=12, start=48, budget=1600, epochs=3, max_new=48
    )
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.steps = 3
    torch.set_num_threads(args.threads)
    from eagle3.recipes import world_cache

    model_dir = build_domains_world(world_cache())
    started = time.monotonic()
    results = [cached_seed(model_dir, int(s), args) for s in str(args.seeds).split(",")]
    ratios = [r["ratio"] for r in results if r["ratio"] is not None]
    summary = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "wall_s": round(time.monotonic() - started, 1),
        "ratio_tokens_to_reach_uniform_final": spread(ratios),
        "not_reached": [r["seed"] for r in results if r["ratio"] is None],
        "uniform_final_accept": interval([r["uniform_final_accept"] for r in results], sign=""),
        "aimed_final_accept": interval([r["aimed_final_accept"] for r in results], sign=""),
        "aimed_minus_uniform_at_equal_tokens": interval(
            [r["aimed_final_accept"] - r["uniform_final_accept"] for r in results]
        ),
        "aimed_over_uniform_tokens": spread(
            [r["aimed_tokens"] / r["uniform_tokens"] for r in results]
        ),
        "per_seed": [{k: r[k] for k in PER_SEED} for r in results],
    }
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
