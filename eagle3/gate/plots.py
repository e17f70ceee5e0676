"""The gate report's plots (``eagle3.gate.report.write_report``): throughput per arm and
concurrency, and accept length per speculative config. matplotlib's Agg backend: no display
needed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.rundir.runroot import atomic_path

if TYPE_CHECKING:
    from eagle3.gate.report import GateReport


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
    _pyplot().close(fig)


def plot_throughput(report: GateReport, path: Path) -> None:
    """Output tok/s against concurrency: a line per arm through its pooled levels, a dot per
    round."""
    fig, ax = _pyplot().subplots(figsize=(7, 4.5))
    for arm in report.arms:
        if arm.levels:
            xs = [lv.concurrency for lv in arm.levels]
            (line,) = ax.plot(
                xs, [lv.output_tok_s for lv in arm.levels], marker="o", label=arm.name
            )
            ax.scatter(
                [r.concurrency for r in arm.rounds],
                [r.output_tok_s for r in arm.rounds],
                s=10,
                alpha=0.4,
                color=line.get_color(),
            )  # each round, so the spread is visible
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tok/s")
    ax.set_xscale("log", base=2)
    ax.set_title("Throughput vs concurrency (line: pooled rounds, dots: each round)")
    if ax.get_legend_handles_labels()[0]:  # no arm measured: nothing to name
        ax.legend(fontsize=7)
    _save(fig, path)


def plot_accept(report: GateReport, path: Path) -> None:
    """Accept length of each speculative arm, every level and round pooled, against
    ``min_accept``."""
    spec_arms = [a for a in report.arms if a.role != "baseline" and a.rounds]
    fig, ax = _pyplot().subplots(figsize=(7, 4.5))
    ax.bar(
        range(len(spec_arms)),
        [a.accept().accept_length or 0.0 for a in spec_arms],
        color="tab:green",
    )
    ax.set_xticks(
        range(len(spec_arms)), [a.name for a in spec_arms], rotation=30, ha="right", fontsize=7
    )
    ax.axhline(report.thresholds["min_accept"], color="tab:red", linestyle="--", label="min_accept")
    ax.set_ylabel("accept length (every level)")
    ax.set_title("Accept length per config")
    ax.legend(fontsize=7)
    _save(fig, path)
