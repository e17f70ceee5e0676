"""Regen's sampling, measured: a draft trained on greedy-regenerated data against one trained on
data regenerated at the served temperature, each evaluated greedily and at that temperature. Not a
test: it prints numbers.

    python benchmarks/regen_sampling.py [--recipe tiny] [--temperature 1.0] [--top-p 0.95] [--seeds
                                        3] [--eval-seeds 2] [--root DIR] [--set a.b=value ...]

Method: the recipe's own stages in this process (``eagle3.stage.run_stage``: discover, normalize,
regen through the recipe's server, capture, vocab, train, export), once with the recipe's regen
sampling set to greedy and once at ``--temperature``/``--top-p`` (default: the recipe's deciding
sampled gate profile, else 1.0 / 0.95); both share the prompts. Each regen arm trains ``--seeds``
drafts (``train.seed``: the initialisation; the data and its order are the arm's). Each draft is
measured on the recipe's gate prompts with the reference speculative decoder
(``eagle3.gate.offline_accept``): greedy accept length, and at the temperature the expected accept
length along the target's sampled continuation (``--eval-seeds`` decodes per prompt). Per arm: the
mean over seeds with its 95% t interval; sampled-regen minus greedy-regen paired by seed. The
stages' directories are kept under ``--root`` (default a temporary one): a re-run with the same root
skips what is done, so it can be killed and resumed.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from objectives import t_interval

from eagle3.capture.stage import FeatureSource
from eagle3.config.pipeline import PipelineConfig
from eagle3.config.sampling import SamplingParams
from eagle3.recipes import resolve


def _stages(config: PipelineConfig) -> tuple[FeatureSource, Path]:
    """Discover through vocab for ``config``; returns (the features, vocab file)."""
    from eagle3.capture.stage import CaptureStage
    from eagle3.data.stage import DiscoverStage, NormalizeStage
    from eagle3.regen.stage import RegenStage
    from eagle3.stage import run_stage
    from eagle3.train.stage import vocab_file
    from eagle3.train.vocab import VocabStage
    from eagle3.worlds.world import world_builders

    if config.dev.tiny_world:
        world_builders()[config.dev.world](Path(config.dev.cache_dir))
    catalog = run_stage(DiscoverStage(), config).out_dir
    prompts = run_stage(NormalizeStage(), config, catalog_dir=catalog).out_dir
    regen = run_stage(RegenStage(), config, prompts_dir=prompts).out_dir
    features = FeatureSource.of(run_stage(CaptureStage(), config, regen_dir=regen))
    vocab = run_stage(VocabStage(), config, features=features).out_dir
    return features, vocab_file(vocab)


def _draft(config: PipelineConfig, features: FeatureSource, vocab: Path) -> Path:
    from eagle3.stage import run_stage
    from eagle3.train.stage import ExportStage, TrainStage

    draft = run_stage(TrainStage(), config, features=features, vocab=vocab).out_dir
    export = run_stage(ExportStage(), config, draft_dir=draft, vocab=vocab, features=features)
    return Path(export.summary["export"])


class Evaluator:
    """The recipe's target and gate prompts, loaded once; ``__call__`` measures one draft."""

    def __init__(self, config: PipelineConfig, sampling: SamplingParams, eval_seeds: int) -> None:
        from eagle3.gate.prompts import load_gate_prompts
        from eagle3.target_io import load_causal_lm, load_tokenizer

        target = config.target
        self.tokenizer = load_tokenizer(target)
        self.model = load_causal_lm(target, dtype=getattr(torch, target.dtype)).eval()
        gate = config.gate
        loaded = load_gate_prompts(gate.prompt_sets, self.tokenizer, per_set=gate.prompts_per_set)
        self.prompts = [list(p.input_ids) for p in loaded]
        self.eos = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        self.config, self.sampling, self.eval_seeds = config, sampling, eval_seeds

    def __call__(self, export: Path) -> dict:
        from eagle3.gate.offline_accept import evaluate_acceptance, evaluate_sampled
        from eagle3.serve.reference.spec_decoder import SpeculativeDecoder

        steps, new = self.config.speculative.num_steps, self.config.gate.max_new_tokens
        decoder = SpeculativeDecoder(self.model, self.tokenizer, export, steps)
        greedy = evaluate_acceptance(decoder, self.prompts, max_new_tokens=new, eos_ids=self.eos)
        hot = evaluate_sampled(
            decoder,
            self.prompts,
            self.sampling,
            max_new_tokens=new,
            eos_ids=self.eos,
            seeds=self.eval_seeds,
        )
        return {
            "greedy": greedy["accept_length"],
            "greedy_prompts_ci": greedy["interval"],
            "at_t": hot["expected_accept_length"],
            "at_t_prompts_ci": hot["expected_interval"],
            "at_t_measured": hot["accept_length"],
        }


def _summary(runs: dict[str, list[dict]], key: str) -> dict:
    out = {}
    for arm, rows in runs.items():
        mean, lo, hi = t_interval([r[key] for r in rows])
        out[arm] = {
            "mean": round(mean, 3),
            "95ci": [round(lo, 3), round(hi, 3)],
            "seeds": len(rows),
        }
    if len(runs) == 2:
        base, other = runs.values()
        mean, lo, hi = t_interval([o[key] - b[key] for o, b in zip(other, base, strict=True)])
        out["sampled_minus_greedy"] = {"mean": round(mean, 3), "95ci": [round(lo, 3), round(hi, 3)]}
    return out


def _sampling(
    config: PipelineConfig, temperature: float | None, top_p: float | None
) -> SamplingParams:
    served = next((p for p in config.gate.sampling.values() if p.decides and not p.greedy), None)
    served = served or next((p for p in config.gate.sampling.values() if not p.greedy), None)
    base = served.params() if served else SamplingParams(temperature=1.0, top_p=0.95)
    changes = {
        k: v for k, v in {"temperature": temperature, "top_p": top_p}.items() if v is not None
    }
    return base.replace(**changes)


def run(
    recipe: str,
    overrides: list[str],
    *,
    temperature: float | None,
    top_p: float | None,
    seeds: int,
    eval_seeds: int,
    root: Path,
) -> dict:
    base = resolve(recipe, [*overrides, f"root={root}"])
    sampling = _sampling(base, temperature, top_p)
    arms = {
        "greedy-regen": ["regen.temperature=0.0"],
        "sampled-regen": [
            f"regen.temperature={sampling.temperature}",
            f"regen.top_p={sampling.top_p}",
            f"regen.top_k={sampling.top_k}",
        ],
    }
    evaluate = Evaluator(base, sampling, eval_seeds)
    runs: dict[str, list[dict]] = {}
    for arm, regen in arms.items():
        config = resolve(recipe, [*overrides, f"root={root}", *regen])
        started = time.monotonic()
        features, vocab = _stages(config)
        data_s = round(time.monotonic() - started, 1)
        for seed in range(seeds):
            started = time.monotonic()
            export = _draft(config.replace(train=config.train.replace(seed=seed)), features, vocab)
            row = {
                "arm": arm,
                "seed": seed,
                "data_s": data_s,
                **evaluate(export),
                "train_eval_s": round(time.monotonic() - started, 1),
            }
            runs.setdefault(arm, []).append(row)
            print(json.dumps(row), flush=True)
    return {
        "recipe": recipe,
        "overrides": overrides,
        "served": sampling.label(),
        "seeds": seeds,
        "eval_seeds": eval_seeds,
        "prompts": len(evaluate.prompts),
        "greedy_eval": _summary(runs, "greedy"),
        "eval_at_t": _summary(runs, "at_t"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="tiny", help="recipe name or YAML file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="a.b=value")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seeds", type=int, default=3, help="drafts trained per regen arm")
    parser.add_argument("--eval-seeds", type=int, default=2, help="sampled decodes per prompt")
    parser.add_argument("--root", type=Path, default=None, help="run root kept for resuming")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = args.root or Path(tempfile.mkdtemp(prefix="eagle3-regen-sampling-"))
    result = run(
        args.recipe,
        args.overrides,
        temperature=args.temperature,
        top_p=args.top_p,
        seeds=args.seeds,
        eval_seeds=args.eval_seeds,
        root=root,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
