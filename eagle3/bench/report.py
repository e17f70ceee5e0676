"""Gate results: per-arm, per-concurrency measurements, the decision, and the report files (JSON, Markdown, PNG).

Design choices:
- Accept length of a level is ``sum(completion_tokens) / sum(spec_verify_ct)`` over its timed requests (never the
  server's cumulative average); output tok/s is completion tokens over the level's wall time; TPOT is the mean
  over requests of ``latency / completion_tokens`` (non-streaming, so it includes the prefill share).
- The report is plain dataclasses serialised with ``asdict``; ``GateReport.from_dict`` reads one back so a finished
  gate is not re-measured on resume. Plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3.bench.prompts import RequestResult
from eagle3.runroot import atomic_path, atomic_write_json, atomic_write_text

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
THROUGHPUT_PNG = "throughput.png"
ACCEPT_PNG = "accept_length.png"


@dataclass
class LevelStats:
    concurrency: int
    requests: int
    completion_tokens: int
    spec_verify_ct: int
    duration_s: float
    output_tok_s: float
    tpot_ms: float
    accept_length: float | None

    @classmethod
    def of(cls, concurrency: int, results: list[RequestResult], duration_s: float) -> LevelStats:
        tokens = sum(r.completion_tokens for r in results)
        verify = sum(r.spec_verify_ct for r in results)
        per_token = [r.latency_s / r.completion_tokens for r in results if r.completion_tokens > 0]
        return cls(
            concurrency=concurrency,
            requests=len(results),
            completion_tokens=tokens,
            spec_verify_ct=verify,
            duration_s=duration_s,
            output_tok_s=tokens / duration_s if duration_s > 0 else 0.0,
            tpot_ms=1000.0 * sum(per_token) / len(per_token) if per_token else 0.0,
            accept_length=tokens / verify if verify > 0 else None,
        )


@dataclass
class ArmResult:
    """One measured server: ``role`` is baseline, candidate or champion; ``config_label`` names its spec config."""

    name: str
    role: str
    url: str
    draft: str | None = None
    draft_id: str | None = None
    config_label: str | None = None
    speculative: dict[str, Any] | None = None
    launch_used: str | None = None
    launch_sglang: str | None = None
    levels: list[LevelStats] = field(default_factory=list)
    preflight: list[dict[str, Any]] = field(default_factory=list)
    flush_failures: list[str] = field(default_factory=list)  # levels measured without a cache flush (bench.gate)
    error: str | None = None

    def level(self, concurrency: int) -> LevelStats | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArmResult:
        data = dict(data)
        data["levels"] = [LevelStats(**lv) for lv in data.get("levels", [])]
        return cls(**data)


@dataclass
class Decision:
    """The verdict for one candidate draft at the decision concurrency (its best spec config)."""

    draft: str
    passed: bool
    best_arm: str | None
    speedup: float | None
    accept_length: float | None
    gain_over_champion: float | None
    reasons: list[str] = field(default_factory=list)


@dataclass
class GateReport:
    fingerprint: str
    target: str
    thresholds: dict[str, Any]
    prompts: dict[str, int]
    arms: list[ArmResult]
    decisions: list[Decision]
    passed: bool
    best: dict[str, Any] | None = None
    champion: dict[str, Any] | None = None
    promotion: dict[str, Any] | None = None
    created_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GateReport:
        data = dict(data)
        data["arms"] = [ArmResult.from_dict(a) for a in data["arms"]]
        data["decisions"] = [Decision(**d) for d in data["decisions"]]
        return cls(**data)


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def to_markdown(report: GateReport) -> str:
    verdict = "PASS" if report.passed else "FAIL"
    t = report.thresholds
    lines = [
        f"# EAGLE-3 gate: {verdict}",
        "",
        f"target `{report.target}`, fingerprint `{report.fingerprint}`, prompts {report.prompts}",
        f"thresholds: speedup >= {t['min_speedup']}, accept length >= {t['min_accept']}, gain over champion >= "
        f"{t['min_gain_over_champion']} at concurrency {t['decision_concurrency']}",
        "",
        "| arm | role | concurrency | output tok/s | TPOT ms | accept length | requests |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for arm in report.arms:
        if arm.error:
            lines.append(f"| {arm.name} | {arm.role} | - | - | - | - | error: {arm.error} |")
        for lv in arm.levels:
            lines.append(
                f"| {arm.name} | {arm.role} | {lv.concurrency} | {lv.output_tok_s:.1f} | {lv.tpot_ms:.1f} | "
                f"{_fmt(lv.accept_length)} | {lv.requests} |"
            )
    unflushed = [f"- {arm.name}: {note}" for arm in report.arms for note in arm.flush_failures]
    if unflushed:
        lines += ["", "## Levels measured without a cache flush", "", *unflushed]
    lines += ["", "## Decisions", ""]
    for d in report.decisions:
        head = f"- `{d.draft}`: **{'pass' if d.passed else 'fail'}** (best arm {d.best_arm}, speedup "
        head += f"{_fmt(d.speedup)}, accept {_fmt(d.accept_length)}, gain over champion {_fmt(d.gain_over_champion)})"
        lines.append(head)
        lines += [f"  - {reason}" for reason in d.reasons]
    if report.best:
        lines += ["", "## Best config", "", f"`{json.dumps(report.best.get('speculative'))}`", ""]
        lines += ["SGLang launch command:", "", "```", str(report.best.get("launch_sglang")), "```"]
    if report.promotion:
        lines += ["", f"Promoted draft `{report.promotion['draft_id']}` to champion ({report.promotion['draft_dir']})."]
    elif report.champion:
        lines += ["", f"Champion unchanged: `{report.champion.get('draft_id')}`."]
    return "\n".join(lines) + "\n"


def _plot_throughput(report: GateReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm in report.arms:
        if arm.levels:
            xs = [lv.concurrency for lv in arm.levels]
            ax.plot(xs, [lv.output_tok_s for lv in arm.levels], marker="o", label=arm.name)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tok/s")
    ax.set_xscale("log", base=2)
    ax.set_title("Throughput vs concurrency")
    ax.legend(fontsize=7)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)


def _plot_accept(report: GateReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = report.thresholds["decision_concurrency"]
    spec_arms = [a for a in report.arms if a.role != "baseline" and a.level(c) is not None]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    values = [a.level(c).accept_length or 0.0 for a in spec_arms]  # type: ignore[union-attr]
    ax.bar(range(len(spec_arms)), values, color="tab:green")
    ax.set_xticks(range(len(spec_arms)), [a.name for a in spec_arms], rotation=30, ha="right", fontsize=7)
    ax.axhline(report.thresholds["min_accept"], color="tab:red", linestyle="--", label="min_accept")
    ax.set_ylabel(f"accept length (concurrency {c})")
    ax.set_title("Accept length per config")
    ax.legend(fontsize=7)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)


def write_report(report: GateReport, out_dir: Path) -> dict[str, Path]:
    """Write report.json, report.md and the two plots into ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    paths = {
        "json": out_dir / REPORT_JSON,
        "markdown": out_dir / REPORT_MD,
        "throughput_png": out_dir / THROUGHPUT_PNG,
        "accept_png": out_dir / ACCEPT_PNG,
    }
    _plot_throughput(report, paths["throughput_png"])
    _plot_accept(report, paths["accept_png"])
    atomic_write_text(paths["markdown"], to_markdown(report))
    atomic_write_json(paths["json"], report.to_dict())
    return paths


def read_report(out_dir: Path) -> GateReport:
    return GateReport.from_dict(json.loads((Path(out_dir) / REPORT_JSON).read_text()))
