"""Nightly data scaling: which prompt shards tonight's run uses, and the scaling curve that answers
"is the draft still data-limited?".

Design choices:

* **Cumulative totals over a stable order.** The prompts stage writes one deterministic order of the
  whole prompt pool, cut into shards of ``normalize.shard_size`` rows. A night with cumulative total
  ``N`` uses the first ``ceil(N / shard_size)`` whole shards. Shard ``k`` holds the same rows
  whatever ``N`` is, so a shard regenerated and captured on an earlier night keeps its per-shard
  cache key and is reused, never redone; only the new shards run. Totals are therefore rounded up to
  whole shards (recorded as ``total_prompts`` = rows actually selected).
* **The curve is the ledger.** Tonight's target is the last recorded point's target plus ``scale``.
  A point is written only when a night reaches its gate, so a night that crashed and is run again
  picks the same target and resumes instead of growing the set twice. Points are keyed by the draft
  fingerprint: re-running a finished night replaces its point rather than appending a duplicate.
* **Plain files.** ``<root>/scaling/curve.jsonl`` (one JSON object per night, rewritten atomically;
  it stays tiny), plus a PNG and a Markdown table rendered from it.
* **Each night says how it chose.** ``policy`` is ``uniform`` or ``aimed`` (``scaling.policy``); an
  aimed night also records, per domain, the rows and regenerated tokens selected so far and the
  night's draft's accept length on that domain's held-out eval prompts: the points the next aimed
  night estimates each domain's gain from.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eagle3.rundir.layout import shard_index
from eagle3.rundir.runroot import FileEntry, atomic_path, atomic_write_text

logger = logging.getLogger(__name__)

CURVE_FILE = "curve.jsonl"


@dataclass(frozen=True)
class ScalingPoint:
    """One night on the curve: how much data the candidate saw and how it did at the gate."""

    total_prompts: int  # cumulative prompts selected tonight (whole shards)
    # rows the candidate actually trained on (regen failures and quarantine excluded)
    train_samples: int
    accept_length: float  # at the gate's decision concurrency
    speedup: float  # candidate throughput / baseline throughput at the decision concurrency
    passed: bool
    draft_fingerprint: str
    report: str  # gate report path
    label: str = ""  # free text, e.g. the Prefect flow-run name or the date
    created_at: float = field(default_factory=time.time)
    policy: str = "uniform"  # how the night chose its prompts (scaling.policy)
    # aimed: domain -> rows, tokens, accept
    domains: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class NightPlan:
    """What one night uses: the cumulative target, the shard ids covering it, and which of them are
    new."""

    total_prompts: int
    shard_ids: list[int]
    new_shard_ids: list[int]
    pool_prompts: int
    exhausted: bool  # the pool has no prompts left beyond tonight's selection


def curve_path(root: Path | str) -> Path:
    return Path(root) / "scaling" / CURVE_FILE


def read_curve(root: Path | str) -> list[ScalingPoint]:
    """The recorded nights, oldest first; empty when none ran yet."""
    path = curve_path(root)
    if not path.exists():
        return []
    points = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            points.append(ScalingPoint(**json.loads(line)))
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(
                f"{path}:{n} is not a scaling point ({exc}); fix or delete that line"
            ) from None
    return points


def record_point(root: Path | str, point: ScalingPoint) -> list[ScalingPoint]:
    """Add tonight's point (replacing an earlier point of the same draft) and rewrite the file
    atomically."""
    points = [p for p in read_curve(root) if p.draft_fingerprint != point.draft_fingerprint]
    points.append(point)
    text = "".join(json.dumps(asdict(p), sort_keys=True) + "\n" for p in points)
    atomic_write_text(curve_path(root), text)
    logger.info("scaling curve: %d points (%s)", len(points), curve_path(root))
    return points


def shard_rows(files: Sequence[FileEntry]) -> list[int]:
    """Rows per prompt shard, in shard order, from a prompts manifest's file list (quarantine
    excluded).

    Raises when the shard indices have a gap: a gap would shift every later shard's cumulative
    offset.
    """
    indexed = sorted((i, f.rows) for f in files if (i := shard_index(f.path)) is not None)
    if [i for i, _ in indexed] != list(range(len(indexed))):
        raise ValueError(
            f"prompt shards are not numbered 0..{len(indexed) - 1} without gaps: re-run normalize"
        )
    return [rows for _, rows in indexed]


def plan_night(
    rows_per_shard: Sequence[int], *, scale: int | None, previous_total: int
) -> NightPlan:
    """Tonight's selection: ``previous_total + scale`` prompts rounded up to whole shards (every
    shard without a ``scale``); the shards beyond those covering ``previous_total`` are tonight's
    new ones."""
    if scale is not None and scale <= 0:
        raise ValueError(
            f"scale={scale}: set a positive number of new prompts per night, or leave it unset"
        )
    pool = sum(rows_per_shard)
    target = pool if scale is None else min(pool, previous_total + scale)
    shard_ids = _shards_covering(rows_per_shard, target)
    old = set(_shards_covering(rows_per_shard, previous_total))
    selected = sum(rows_per_shard[k] for k in shard_ids)
    return NightPlan(
        total_prompts=selected,
        shard_ids=shard_ids,
        new_shard_ids=[k for k in shard_ids if k not in old],
        pool_prompts=pool,
        exhausted=selected >= pool,
    )


def _shards_covering(rows_per_shard: Sequence[int], total: int) -> list[int]:
    ids, covered = [], 0
    for k, rows in enumerate(rows_per_shard):
        if covered >= total:
            break
        ids.append(k)
        covered += rows
    return ids


def previous_total(points: Sequence[ScalingPoint]) -> int:
    """The cumulative target of the last recorded night (0 before the first)."""
    return points[-1].total_prompts if points else 0


def data_limited_verdict(
    points: Sequence[ScalingPoint], *, min_gain_per_doubling: float = 0.05
) -> str:
    """A one-line answer from the last three nights: accept-length gain per doubling of the training
    samples.

    The gain is the least-squares slope of accept length against log2(samples); above
    ``min_gain_per_doubling`` the draft is still data-limited (more data keeps helping), below it
    the curve has flattened.
    """
    usable = [p for p in points if p.train_samples > 0][-3:]
    xs = [math.log2(p.train_samples) for p in usable]
    if len(usable) < 2 or max(xs) - min(xs) < 1e-9:
        return "not enough nights yet: need two nights with different training-set sizes"
    mean_x, mean_y = sum(xs) / len(xs), sum(p.accept_length for p in usable) / len(usable)
    slope = sum(
        (x - mean_x) * (p.accept_length - mean_y) for x, p in zip(xs, usable, strict=True)
    ) / sum((x - mean_x) ** 2 for x in xs)
    if slope >= min_gain_per_doubling:
        return (
            f"still data-limited: +{slope:.3f} accept length per doubling of the training samples"
        )
    return f"flattening: {slope:+.3f} accept length per doubling (< {min_gain_per_doubling}); more data helps little"


def curve_table(points: Sequence[ScalingPoint]) -> list[dict[str, object]]:
    return [
        {
            "night": n,
            "label": p.label,
            "total_prompts": p.total_prompts,
            "train_samples": p.train_samples,
            "accept_length": round(p.accept_length, 3),
            "speedup": round(p.speedup, 3),
            "passed": p.passed,
            "policy": p.policy,
            "report": p.report,
        }
        for n, p in enumerate(points, start=1)
    ]


def curve_markdown(points: Sequence[ScalingPoint], *, png: Path | None = None) -> str:
    lines = [
        "# Data-scaling curve",
        "",
        f"**Verdict:** {data_limited_verdict(points)}",
        "",
        "| night | policy | total prompts | train samples | accept length | speedup | gate |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for row in curve_table(points):
        gate = "pass" if row["passed"] else "refused"
        lines.append(
            f"| {row['night']} | {row['policy']} | {row['total_prompts']:,} | {row['train_samples']:,} | "
            f"{row['accept_length']:.3f} | {row['speedup']:.3f} | {gate} |"
        )
    lines += domain_markdown(points)
    if png is not None:
        lines += ["", f"Plot: `{png}`"]
    return "\n".join(lines) + "\n"


def domain_markdown(points: Sequence[ScalingPoint]) -> list[str]:
    """The per-domain points of the aimed nights: rows, regenerated tokens and accept length per
    night."""
    aimed = [(n, p) for n, p in enumerate(points, start=1) if p.domains]
    if not aimed:
        return []
    lines = [
        "",
        "Per domain (aimed nights; accept length on the held-out eval set):",
        "",
        "| night | domain | rows | regenerated tokens | accept length |",
        "|---:|---|---:|---:|---:|",
    ]
    for n, point in aimed:
        for domain, row in sorted(point.domains.items()):
            accept = "-" if row.get("accept") is None else f"{row['accept']:.3f}"
            lines.append(
                f"| {n} | {domain} | {int(row['rows']):,} | {int(row['tokens']):,} | {accept} |"
            )
    return lines


def plot_curve(points: Sequence[ScalingPoint], path: Path) -> Path:
    """Accept length and speedup against training samples (log x axis), one marker per night."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [max(p.train_samples, 1) for p in points]
    fig, (ax_acc, ax_speed) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    ax_acc.plot(xs, [p.accept_length for p in points], marker="o")
    ax_acc.set(xlabel="training samples", ylabel="accept length", title="accept length vs data")
    ax_speed.plot(xs, [p.speedup for p in points], marker="o", color="tab:green")
    ax_speed.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax_speed.set(xlabel="training samples", ylabel="speedup vs baseline", title="speedup vs data")
    for ax in (ax_acc, ax_speed):
        if len(set(xs)) > 1:
            ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    with atomic_path(Path(path)) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return Path(path)
