"""Does a speculative server honour sampling? Asked before the gate measures a profile that samples.

The failure this exists for: SGLang 0.5.23 verifies every speculative request by argmax on CPU and
XPU (and on ROCm without rejection sampling), whatever its temperature, with no warning
(``eagle_utils._verify_uses_greedy``). Its speculative arm then answers a sampled request with its
greedy tokens, and a sampled gate would compare a greedy arm against a sampled baseline: a verdict
about traffic nobody serves.

The probe (``check_sampling``): a prompt sent ``SEEDS`` times at the profile's sampling, each with
its own ``sampling_seed``, to the speculative arm and to the baseline. An engine's first token comes
from its prefill, which samples correctly on every device; only what follows is verified. So each
answer is compared after its first token ``f``: with the speculative arm's greedy answer to the
prompt followed by ``f``, which is what a greedy-verifying engine must answer next. Count the
answers whose rest differs from that: ``s`` of the speculative arm's, ``b`` of the baseline's. An
engine that samples draws both from the same distribution, so s and b are two Binomial(SEEDS, q)
counts, q the chance a sampled rest is not the greedy one; the engine is refused when ``s == 0``
while ``b >= SEEDS / 2``. For a sampling engine that happens at most max_q (1 - q)^24
P(Bin(24, q) >= 12) = 7e-6 of the time per prompt (at q = 0.26); for a greedy-verifying engine it
happens whenever the prompt leaves room to sample (q >= 0.6 gives b >= 12 with probability >= 0.88;
31 sampled tokens are rarely the greedy ones, q near 1).
A prompt with too little room (b below half) cannot tell: the next is tried, up to ``PROMPTS``; when
none can, the check passes and says so (a target that sure of itself looks greedy under any engine).
Servers that ignore ``sampling_seed`` (SGLang without ``--enable-deterministic-inference``) sample
at random instead, which the probe does not need.
"""

from __future__ import annotations

from collections.abc import Sequence

from eagle3.config.sampling import SamplingParams
from eagle3.gate.preflight import Check
from eagle3.gate.prompts import GREEDY, send_prompts

SEEDS = 24
PROMPTS = 3
PROBE_TOKENS = 32


def _answers(
    url: str, ids: list[int], sampling: list[dict], max_new_tokens: int
) -> list[tuple[int, ...]] | str:
    """Each request's output ids, or why the requests failed."""
    pairs = [(f"probe-{i}", ids) for i in range(len(sampling))]
    results = send_prompts(
        url, pairs, concurrency=len(pairs), max_new_tokens=max_new_tokens, sampling=sampling
    )
    errors = [r.error for r in results if r.error]
    if errors:
        return f"{len(errors)} probe requests to {url} failed, first: {errors[0]}"
    return [r.output_ids for r in results]


def _greedy_rests(
    url: str, ids: list[int], firsts: list[int], max_new_tokens: int
) -> dict[int, tuple[int, ...]] | str:
    """The greedy answer to ``ids`` followed by each first token: what a greedy-verifying engine
    answers after that token."""
    if max_new_tokens < 1:
        return {f: () for f in firsts}
    pairs = [(f"probe-greedy-{f}", [*ids, f]) for f in firsts]
    results = send_prompts(
        url,
        pairs,
        concurrency=len(pairs),
        max_new_tokens=max_new_tokens,
        sampling=[GREEDY] * len(pairs),
    )
    errors = [r.error for r in results if r.error]
    if errors:
        return f"{len(errors)} probe requests to {url} failed, first: {errors[0]}"
    return {f: tuple(r.output_ids) for f, r in zip(firsts, results, strict=True)}


def check_sampling(
    spec_url: str,
    baseline_url: str,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    max_new_tokens: int = PROBE_TOKENS,
) -> Check:
    """The probe of the module docstring against one speculative server, at ``params``."""
    label = params.label()
    sampled = [params.request() | {"sampling_seed": seed} for seed in range(SEEDS)]
    for n, ids in enumerate(prompts[:PROMPTS]):
        spec = _answers(spec_url, list(ids), sampled, max_new_tokens)
        base = _answers(baseline_url, list(ids), sampled, max_new_tokens)
        if isinstance(spec, str) or isinstance(base, str):
            return Check("sampling", False, spec if isinstance(spec, str) else str(base))
        firsts = sorted({a[0] for a in (*spec, *base) if a})
        rests = _greedy_rests(spec_url, list(ids), firsts, max_new_tokens - 1)
        if isinstance(rests, str):
            return Check("sampling", False, rests)
        # an answer that ended at its first token says nothing of how the rest is verified
        s = sum(len(a) > 1 and a[1:] != rests[a[0]] for a in spec)
        b = sum(len(a) > 1 and a[1:] != rests[a[0]] for a in base)
        if s == 0 and b >= SEEDS / 2:
            return Check("sampling", False, ignored(n, label, b))
        if b >= SEEDS / 2:
            message = (
                f"at {label} {s} of the speculative server's {SEEDS} seeded answers to prompt {n} "
                f"go on otherwise than greedily after their first token, {b} of the baseline's: "
                "it samples"
            )
            return Check("sampling", True, message)
    message = (
        f"at {label} no probe prompt left room to sample (the baseline's answers stayed greedy on "
        f"{min(len(prompts), PROMPTS)} prompts): sampling could not be told from greedy"
    )
    return Check("sampling", True, message)


def ignored(n: int, label: str, b: int) -> str:
    """The one line that refuses an engine ignoring sampling: what was seen, the cause, the fix."""
    return (
        f"after its first token the speculative server went on greedily in all {SEEDS} seeded "
        f"answers to probe prompt {n} at {label}, while the baseline did not in {b}: it "
        "verifies speculative requests greedily and ignores sampling (SGLang 0.5.23 does on CPU "
        "and XPU); measure this profile on a GPU server or take it out of gate.sampling"
    )
