"""The gate's traffic profile from served traffic (``gate.profile: served``): "is this draft faster
on *our* load".

A hand-written ``gate.traffic`` guesses the load; the served sources' request logs
(``eagle3.data.served_log``) record it. From them:

* **Concurrency over time.** Every finished request is in flight from its ``request.received`` to
  its ``request.finished`` timestamp. The number of requests in flight is a step function of time;
  each request is placed at the mean of that function over its own life (its concurrency, itself
  included), rounded to the nearest power of two in log space, and weighs its completion tokens: a
  level's share is the share of the served tokens generated at that concurrency, which is what a
  speedup at that level buys. The ``gate.max_levels`` heaviest levels are kept (each costs a timed
  batch per arm and round) and their weights normalized; they become ``gate.traffic``.
* **Lengths.** Prompt and completion token counts (``meta_info``, read at every log level): their
  percentiles are in the profile, and ``gate.max_new_tokens`` becomes the 90th percentile of the
  completions, so the gate's requests are as long as the served ones.
* **Sampling.** The sampling parameters the requests carried (level >= 1): each (temperature, top_p,
  top_k) and its share of the requests, in the profile; each carrying a tenth of the requests
  becomes a ``gate.sampling`` profile (``eagle3.config.sampling``), measured with its own verdict,
  which decides when it carries a quarter (the commonest always does).
* **A held-out prompt set.** The requests ``served.held_out`` sets aside (never trained on:
  normalization quarantines them and decontaminates every source against them) become the ``served``
  prompt set, JSONL rows of the recovered turns (``eagle3.data.template_inverse``), which the gate
  renders back into exactly the served ids.

The profile is built once per state of the logs (``<root>/profile/<fp>/profile.json`` and
``served.jsonl``; the fingerprint covers the log files' sizes and times, ``served`` and the gate's
settings) and written into the gate's config (``gate.profile_note`` says how it was built; the
report prints it).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.config.sampling import SamplingParams, SamplingProfile
from eagle3.data import catalog
from eagle3.data.served import SERVED, ServedReader, served_tokenizer
from eagle3.data.served_log import ServedRequest, iter_log, log_files
from eagle3.rundir.layout import stage_dir
from eagle3.rundir.runroot import atomic_write_json, atomic_write_text, fingerprint

logger = logging.getLogger(__name__)

PROFILE_FILE, PROMPTS_FILE = "profile.json", "served.jsonl"
SERVED_SET = "served"
PROFILE_VERSION = "1"
# the share of the requests a sampling needs to be measured, and for its verdict to decide
SAMPLING_SHARE, DECIDING_SHARE = 0.1, 0.25


class ProfileError(ValueError):
    """The served profile cannot be built (no served source, no finished request); the message names
    the fix."""


@dataclass(frozen=True)
class ServedProfile:
    """What the logs say about the load, and where the held-out prompts are."""

    traffic: dict[int, float]
    max_new_tokens: int
    requests: int
    time_range: tuple[float, float]
    prompt_tokens: dict[str, int]
    completion_tokens: dict[str, int]
    sampling: list[dict[str, Any]]
    level_shares: dict[int, float]  # every level seen, before keeping the heaviest
    held_out_prompts: int
    prompt_set: str | None
    files: list[str]

    def note(self) -> str:
        """One line for the report: how the profile was built."""
        start, end = (_clock(t) for t in self.time_range)
        levels = ", ".join(f"{c}: {w:.2f}" for c, w in self.traffic.items())
        sampling = (
            ", ".join(f"{_sampling_label(s)} {s['share']:.0%}" for s in self.sampling[:3])
            or "not logged"
        )
        held = (
            f"{self.held_out_prompts} held-out prompts"
            if self.prompt_set
            else "no held-out prompts"
        )
        files, p50 = len(self.files), self.prompt_tokens["p50"]
        return (
            f"from {self.requests} served requests ({start} to {end}, {files} log files): "
            f"concurrency {{{levels}}} by share of generated tokens; max_new_tokens "
            f"{self.max_new_tokens} (p90 of completions; prompts p50 {p50}); sampling "
            f"{sampling}; {held}"
        )


def _clock(t: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _sampling_label(s: dict[str, Any]) -> str:
    try:
        return _params(s).label()
    except ValueError:
        return f"T={s['temperature']} top_p={s['top_p']} top_k={s['top_k']} (not a valid sampling)"


def _params(s: dict[str, Any]) -> SamplingParams:
    return SamplingParams(temperature=s["temperature"], top_p=s["top_p"], top_k=s["top_k"])


def served_sampling(observed: list[dict[str, Any]]) -> dict[str, SamplingProfile]:
    """The gate's sampling profiles from the samplings the logs hold (commonest first): each that
    carries at least ``SAMPLING_SHARE`` of the requests, named by its label; the commonest and any
    carrying ``DECIDING_SHARE`` decide, the others are measured and reported. Samplings that are
    not valid ones (a top_k of 0) are left out; none logged (levels 0): no profile."""
    out: dict[str, SamplingProfile] = {}
    for s in observed:
        if out and s["share"] < SAMPLING_SHARE:
            break
        try:
            params = _params(s)
        except ValueError:
            continue
        decides = not out or s["share"] >= DECIDING_SHARE
        out.setdefault(params.label(), SamplingProfile(**params.model_dump(), decides=decides))
    return out


def _percentiles(values: list[int]) -> dict[str, int]:
    if not values:
        return {"p10": 0, "p50": 0, "p90": 0, "max": 0}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p10": pick(0.1), "p50": pick(0.5), "p90": pick(0.9), "max": ordered[-1]}


def mean_concurrency(intervals: list[tuple[float, float]]) -> list[float]:
    """Each interval's mean number of intervals in flight over its own life (itself included)."""
    edges = sorted({t for interval in intervals for t in interval})
    delta = [0] * (len(edges) + 1)
    for start, end in intervals:
        delta[bisect.bisect_left(edges, start)] += 1
        delta[bisect.bisect_left(edges, end)] -= 1
    area, level, cumulative = 0.0, 0, [0.0]  # cumulative[i]: integral of the count up to edges[i]
    for i in range(1, len(edges)):
        level += delta[i - 1]
        area += level * (edges[i] - edges[i - 1])
        cumulative.append(area)
    out = []
    for start, end in intervals:
        i, j = bisect.bisect_left(edges, start), bisect.bisect_left(edges, end)
        out.append((cumulative[j] - cumulative[i]) / (end - start) if end > start else 1.0)
    return out


def traffic_levels(
    requests: list[ServedRequest], *, max_levels: int
) -> tuple[dict[int, float], dict[int, float]]:
    """(the kept levels and their normalized weights, each level's share of generated tokens)."""
    intervals = [(r.received_at, r.finished_at) for r in requests]
    shares: Counter[int] = Counter()
    for req, c in zip(requests, mean_concurrency(intervals), strict=True):
        level = 2 ** max(0, round(math.log2(max(c, 1.0))))
        shares[level] += int(req.meta_info.get("completion_tokens") or 0) or 1
    total = sum(shares.values())
    every = {c: shares[c] / total for c in sorted(shares)}
    kept = sorted(sorted(every, key=lambda c: (-every[c], c))[:max_levels])
    weight = sum(every[c] for c in kept)
    return {c: round(every[c] / weight, 4) for c in kept}, {
        c: round(s, 4) for c, s in every.items()
    }


def _sampling(requests: list[ServedRequest]) -> list[dict[str, Any]]:
    seen = [r.sampling_params for r in requests if r.sampling_params]
    keys = Counter(
        (p.get("temperature", 1.0), p.get("top_p", 1.0), p.get("top_k", -1)) for p in seen
    )
    return [
        {"temperature": t, "top_p": p, "top_k": k, "share": round(n / len(seen), 4)}
        for (t, p, k), n in keys.most_common()
    ]


def served_files(config: PipelineConfig) -> list[Path]:
    files = []
    for source in config.sources:
        if catalog.get(source.adapter).row_format == SERVED and source.path:
            files += log_files(source.path)
    return files


def build_profile(config: PipelineConfig, out_dir: Path) -> ServedProfile:
    """Read the served sources' logs into a profile; writes the held-out prompt set into
    ``out_dir``."""
    files = served_files(config)
    requests = [r for r in iter_log(files) if isinstance(r, ServedRequest) and not r.health_check]
    if not requests:
        raise ProfileError(
            "gate.profile=served needs finished requests in a local served source's logs; add one "
            "(sources: [{adapter: served, path: <log dir>}]) or set gate.profile=config"
        )
    traffic, every = traffic_levels(requests, max_levels=config.gate.max_levels)
    completions = [int(r.meta_info.get("completion_tokens") or 0) for r in requests]
    prompts = [int(r.meta_info.get("prompt_tokens") or 0) for r in requests]
    held = ServedReader.open(config, files, served_tokenizer(config)).held_out_requests()
    prompt_set = None
    if held:
        rows = [
            {
                "id": req.rid,
                "prompt": next(m["content"] for m in reversed(msgs) if m["role"] == "user"),
                "messages": msgs,
            }
            for req, msgs in held
        ]
        atomic_write_text(out_dir / PROMPTS_FILE, "".join(json.dumps(row) + "\n" for row in rows))
        prompt_set = str(out_dir / PROMPTS_FILE)
    return ServedProfile(
        traffic=traffic,
        max_new_tokens=max(16, _percentiles(completions)["p90"]),
        requests=len(requests),
        time_range=(min(r.received_at for r in requests), max(r.finished_at for r in requests)),
        prompt_tokens=_percentiles(prompts),
        completion_tokens=_percentiles(completions),
        sampling=_sampling(requests),
        level_shares=every,
        held_out_prompts=len(held),
        prompt_set=prompt_set,
        files=[str(f) for f in files],
    )


def profile_dir(config: PipelineConfig) -> Path:
    probe = [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in served_files(config)]
    gate = config.gate.model_dump(mode="json", include={"max_levels", "profile"})
    fp = fingerprint(
        PROFILE_VERSION,
        probe,
        config.served.model_dump(mode="json"),
        gate,
        config.target.model_path,
    )
    return stage_dir(config.root_path, "profile", fp)


def load_profile(config: PipelineConfig) -> ServedProfile:
    """The profile of the logs as they are now: read back, or built and written (``profile.json``
    last)."""
    out = profile_dir(config)
    path = out / PROFILE_FILE
    if path.exists():
        data = json.loads(path.read_text())
        data["traffic"] = {int(c): w for c, w in data["traffic"].items()}
        data["level_shares"] = {int(c): w for c, w in data["level_shares"].items()}
        data["time_range"] = tuple(data["time_range"])
        return ServedProfile(**data)
    out.mkdir(parents=True, exist_ok=True)
    profile = build_profile(config, out)
    atomic_write_json(path, asdict(profile))
    logger.info("served profile %s: %s", out, profile.note())
    return profile


def with_served_profile(config: PipelineConfig) -> PipelineConfig:
    """``config`` with the gate's traffic, ``max_new_tokens``, sampling profiles, the ``served``
    prompt set and the note from the served profile when ``gate.profile`` is ``served``;
    unchanged otherwise."""
    if config.gate.profile != "served" or config.gate.profile_note:
        return config
    profile = load_profile(config)
    sets = dict(config.gate.prompt_sets)
    sets |= {SERVED_SET: profile.prompt_set} if profile.prompt_set else {}
    gate = config.gate.replace(
        traffic=profile.traffic,
        max_new_tokens=profile.max_new_tokens,
        prompt_sets=sets,
        sampling=served_sampling(profile.sampling) or config.gate.sampling,
        profile_note=profile.note(),
    )
    return config.replace(gate=gate)
