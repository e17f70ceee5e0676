"""Offline acceptance of a draft (``eagle3 eval``, the aimed nights' domain eval) with the reference
speculative decoder (``eagle3.serve.reference.spec_decoder``), and prompt files rendered with the
project's chat template.

Greedy (``evaluate_acceptance``): accept length = generated tokens / verify passes over the prompts.

At a temperature (``evaluate_sampled``): each prompt is decoded with speculative sampling at that
sampling, once per seed, so the contexts the draft meets are the target's *sampled* continuation:
the ones a server sampling at that temperature meets. (The greedy continuation is more predictable
than the sampled one, so accept lengths measured on it would flatter the draft at T > 0.) Besides
the measured accept length it reports the expected one: at each verify pass the acceptance of draft
j is the target's probability p_j(x_j) of it given the drafts before it, so the pass's expected
tokens are 1 + sum_k prod_{j<=k} p_j(x_j), computed from the two models' distributions along the
continuation. This removes the acceptance coins' noise, not the contexts' (which dominates over a
few dozen prompts: on the tiny world both intervals are about as wide). Intervals: the t interval of
a ratio of sums over prompts (``ratio_of_sums``), prompts as the unit (seeds of a prompt pooled), at
``CONFIDENCE``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eagle3.config.sampling import SamplingParams
from eagle3.gate.stats import t_quantile
from eagle3.serve.reference.sampling import RowSampling, expected_accepted
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder

CONFIDENCE = 0.9


def ratio_of_sums(
    nums: Sequence[float], dens: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, list[float] | None]:
    """sum(nums) / sum(dens) and its t interval over the units (delta method: the residuals
    num_i - ratio * den_i); no interval below 2 units."""
    n, total = len(nums), sum(dens)
    ratio = sum(nums) / total if total else float("nan")
    if n < 2 or not total:
        return ratio, None
    residuals = [a - ratio * b for a, b in zip(nums, dens, strict=True)]
    se = math.sqrt(sum(r * r for r in residuals) / (n * (n - 1))) / (total / n)
    half = t_quantile(0.5 + confidence / 2, n - 1) * se
    return ratio, [ratio - half, ratio + half]


def evaluate_acceptance(
    decoder: SpeculativeDecoder,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    on_prompt: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Offline acceptance over prompts, greedy: total generated tokens / total verify passes, and
    its interval over prompts.

    ``on_prompt`` is called after each prompt is decoded, so a caller (the CLI) can draw progress
    without re-implementing this loop."""
    tokens, passes = [], []
    for ids in prompts:
        decoded = decoder.generate(ids, max_new_tokens, eos_ids)
        tokens.append(len(decoded.tokens))
        passes.append(decoded.passes)
        if on_prompt is not None:
            on_prompt()
    accept, interval = ratio_of_sums(tokens, passes)
    return {
        "prompts": len(prompts),
        "tokens": sum(tokens),
        "verify_passes": sum(passes),
        "accept_length": accept,
        "interval": interval,
        "aux_mode": decoder.aux_mode,
    }


def evaluate_sampled(
    decoder: SpeculativeDecoder,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingParams,
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    seeds: int = 1,
    on_prompt: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Offline acceptance at ``sampling`` along the target's sampled continuation (module
    docstring): the measured and the expected accept length, each with its interval over prompts."""
    tokens, passes, expected = [], [], []
    for ids in prompts:
        t = p = 0
        e = 0.0
        for seed in range(seeds):
            row = RowSampling.seeded(sampling.temperature, sampling.top_p, sampling.top_k, seed)
            decoded = decoder.generate(ids, max_new_tokens, eos_ids, row)
            t, p = t + len(decoded.tokens), p + decoded.passes
            e += sum(1 + float(expected_accepted(_tensor(probs))) for probs in decoded.draft_probs)
        tokens.append(t)
        passes.append(p)
        expected.append(e)
        if on_prompt is not None:
            on_prompt()
    accept, interval = ratio_of_sums(tokens, passes)
    mean, mean_interval = ratio_of_sums(expected, passes)
    return {
        "sampling": sampling.label(),
        "prompts": len(prompts),
        "seeds": seeds,
        "tokens": sum(tokens),
        "verify_passes": sum(passes),
        "accept_length": accept,
        "interval": interval,
        "expected_accept_length": mean,
        "expected_interval": mean_interval,
        "aux_mode": decoder.aux_mode,
    }


def _tensor(probs: list[float]) -> Any:
    import torch

    return torch.tensor([probs])


def load_prompt_file(path: Path, tokenizer: Any, *, limit: int | None = None) -> list[list[int]]:
    """Prompt ids of a prompt set file (any shape ``eagle3.data.prompt_sets`` reads), rendered with
    the project's chat renderer as the gate renders them."""
    from eagle3.data.prompt_sets import read_prompt_set
    from eagle3.data.template import ChatOptions, render_prompt

    rows = read_prompt_set(path, Path(path).stem, limit=limit)
    return [
        render_prompt(
            tokenizer,
            list(row.messages) or [{"role": "user", "content": row.prompt}],
            ChatOptions(tools=list(row.tools) or None),
        )
        for row in rows
    ]
