"""Gate results: per-arm, per-concurrency measurements, the decision, and the report files (JSON, Markdown, PNG).

Design choices:
- Accept length of a level comes from its timed requests' own counters (``eagle3.bench.accept``: SGLang's
  ``spec_accept_length`` when every request sent it, else ``sum(completion_tokens) / sum(spec_verify_ct)``; never the
  server's cumulative average), and the level says which fields it used; output tok/s is completion tokens over the
  level's wall time; TPOT is the mean over requests of ``latency / completion_tokens`` (non-streaming, so it
  includes the prefill share).
- Every arm keeps each round it measured (``ArmResult.rounds``, one ``LevelStats`` per concurrency and round) and
  its rounds pooled per concurrency (``ArmResult.levels``, for the table and the throughput plot). The rounds and
  the thresholds in the JSON are all ``eagle3.bench.verdict.decide`` needs: a verdict can be recomputed offline.
- A verdict is PASS, FAIL or INCONCLUSIVE; ``passed`` (what promotes) is derived from it and kept as a field so
  readers of the JSON (the scaling curve, scripts) need not know the verdicts.
- The report is plain dataclasses serialised with ``asdict``; ``GateReport.from_dict`` reads one back so a finished
  gate is not re-measured on resume. Plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3.bench.accept import ACCEPT_LENGTH_FIELD, AcceptSummary, SpecCounts, pool
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
    round: int | None = None  # None: pooled over the rounds
    accept_source: str | None = None  # the server's spec_accept_length, or computed (eagle3.bench.accept)
    accept_fields: list[str] = field(default_factory=list)  # the meta_info keys the counters came from
    accepted_drafts: int | None = None
    proposed_drafts: int | None = None
    accept_histogram: list[int] | None = None

    @property
    def accept_rate(self) -> float | None:
        return AcceptSummary(accepted_drafts=self.accepted_drafts, proposed_drafts=self.proposed_drafts).accept_rate

    def counts(self) -> SpecCounts:
        """This level's counters as one answer's, to pool levels the way answers are pooled."""
        own = self.accept_length if self.accept_source == ACCEPT_LENGTH_FIELD else None
        hist = tuple(self.accept_histogram) if self.accept_histogram is not None else None
        return SpecCounts(self.completion_tokens, self.spec_verify_ct, own, self.accepted_drafts, self.proposed_drafts,
                          hist, tuple(self.accept_fields))  # fmt: skip

    @classmethod
    def _of(cls, concurrency: int, requests: int, tokens: int, duration: float, tpot_ms: float,
            spec: AcceptSummary) -> LevelStats:  # fmt: skip
        return cls(
            concurrency=concurrency, requests=requests, completion_tokens=tokens, spec_verify_ct=spec.verify_ct,
            duration_s=duration, output_tok_s=tokens / duration if duration > 0 else 0.0, tpot_ms=tpot_ms,
            accept_length=spec.accept_length, accept_source=spec.source, accept_fields=list(spec.fields),
            accepted_drafts=spec.accepted_drafts, proposed_drafts=spec.proposed_drafts,
            accept_histogram=spec.histogram,
        )  # fmt: skip

    @classmethod
    def of(cls, concurrency: int, results: list[RequestResult], duration_s: float) -> LevelStats:
        tokens = sum(r.completion_tokens for r in results)
        per_token = [r.latency_s / r.completion_tokens for r in results if r.completion_tokens > 0]
        tpot_ms = 1000.0 * sum(per_token) / len(per_token) if per_token else 0.0
        return cls._of(concurrency, len(results), tokens, duration_s, tpot_ms, pool([r.spec for r in results]))

    @classmethod
    def pooled(cls, rounds: list[LevelStats]) -> LevelStats:
        """One level from its rounds: token and time sums, request-weighted TPOT, the counters pooled."""
        requests = sum(r.requests for r in rounds)
        tpot_ms = sum(r.tpot_ms * r.requests for r in rounds) / requests if requests else 0.0
        return cls._of(rounds[0].concurrency, requests, sum(r.completion_tokens for r in rounds),
                       sum(r.duration_s for r in rounds), tpot_ms, pool([r.counts() for r in rounds]))  # fmt: skip


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
    levels: list[LevelStats] = field(default_factory=list)  # pooled over rounds, one per concurrency
    rounds: list[LevelStats] = field(default_factory=list)  # every round at every concurrency, in measuring order
    preflight: list[dict[str, Any]] = field(default_factory=list)
    flush_failures: list[str] = field(default_factory=list)  # rounds measured without a cache flush (bench.rounds)
    error: str | None = None

    def level(self, concurrency: int) -> LevelStats | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def rounds_at(self, concurrency: int) -> dict[int, LevelStats]:
        """This arm's rounds at one concurrency, by round number."""
        return {r.round: r for r in self.rounds if r.concurrency == concurrency and r.round is not None}

    def pool(self) -> None:
        """Set ``levels`` from ``rounds``: one pooled level per concurrency, in the order first measured."""
        order = list(dict.fromkeys(r.concurrency for r in self.rounds))
        self.levels = [LevelStats.pooled([r for r in self.rounds if r.concurrency == c]) for c in order]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArmResult:
        data = dict(data)
        data["levels"] = [LevelStats(**lv) for lv in data.get("levels", [])]
        data["rounds"] = [LevelStats(**lv) for lv in data.get("rounds", [])]
        return cls(**data)


PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
VERDICTS: tuple[str, ...] = (PASS, FAIL, INCONCLUSIVE)

# The accept_bound check's derivation (``eagle3.bench.verdict``), printed in every report.
PHYSICAL_BOUND = (
    "Chain speculation with k draft steps: one cycle is a target verify forward over k+1 positions (cost T_v) plus "
    "k draft forwards (cost k*T_d) and emits a tokens on average (a = accept length, bonus token included); the "
    "baseline emits one token per target decode step (cost T) at the same batch. A verify step computes a superset "
    "of a decode step, so T_v >= T, and T_d >= 0, hence speedup = a*T / (T_v + k*T_d) <= a*T / T_v <= a. Prefill "
    "costs both arms the same and only pulls the ratio toward 1 (<= a since a >= 1). A tree (topk > 1) verifies "
    "more positions per step and obeys the same bound. So a round whose speedup exceeds a*(1 + tolerance) measured "
    "the machine, not the draft."
)


def _verdict_of(passed: bool, verdict: str | None) -> str:
    """``verdict`` checked against ``passed``; a report written without a verdict is PASS or FAIL."""
    verdict = verdict or (PASS if passed else FAIL)
    if verdict not in VERDICTS or passed != (verdict == PASS):
        raise ValueError(f"verdict {verdict!r} contradicts passed={passed} (verdicts: {list(VERDICTS)})")
    return verdict


@dataclass
class Decision:
    """The verdict for one candidate draft at the decision concurrency (its best spec config).

    ``speedup`` and ``gain_over_champion`` are geometric means of the per-round paired ratios, ``*_interval`` their
    t intervals; ``checks`` are the physical sanity checks (name, ok, message); ``reasons`` say why it did not pass.
    """

    draft: str
    passed: bool
    best_arm: str | None
    speedup: float | None
    accept_length: float | None
    gain_over_champion: float | None
    reasons: list[str] = field(default_factory=list)
    verdict: str | None = None
    rounds: int = 0
    speedup_interval: list[float] | None = None
    gain_interval: list[float] | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.verdict = _verdict_of(self.passed, self.verdict)


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
    verdict: str | None = None  # PASS if a draft passed, else INCONCLUSIVE if one was, else FAIL

    def __post_init__(self) -> None:
        self.verdict = _verdict_of(self.passed, self.verdict)

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


def _rounds_table(report: GateReport, c: int) -> list[str]:
    """Per-round tok/s of every arm at concurrency ``c`` (accept length of speculative arms in brackets)."""
    arms = [a for a in report.arms if a.rounds_at(c)]
    if not arms:
        return []
    base = next((a.rounds_at(c) for a in arms if a.role == "baseline"), {})
    lines = [f"### Concurrency {c}", "", "| round | " + " | ".join(a.name for a in arms) + " | speedups |",
             "|---:|" + "---:|" * (len(arms) + 1)]  # fmt: skip
    for r in sorted({r for a in arms for r in a.rounds_at(c)}):
        cells, ratios = [], []
        for a in arms:
            stats = a.rounds_at(c).get(r)
            cells.append("-" if stats is None else f"{stats.output_tok_s:.1f}" + (
                f" [{stats.accept_length:.2f}]" if stats.accept_length else ""))  # fmt: skip
            if stats and a.role != "baseline" and r in base and base[r].output_tok_s:
                ratios.append(f"{stats.output_tok_s / base[r].output_tok_s:.3f}")
        lines.append(f"| {r} | " + " | ".join(cells) + f" | {', '.join(ratios) or '-'} |")
    return [*lines, ""]


def _decision_lines(d: Decision) -> list[str]:
    interval = f" {d.speedup_interval[0]:.3f}..{d.speedup_interval[1]:.3f}" if d.speedup_interval else ""
    gain = f" {d.gain_interval[0]:.3f}..{d.gain_interval[1]:.3f}" if d.gain_interval else ""
    lines = [
        f"- `{d.draft}`: **{str(d.verdict).upper()}** after {d.rounds} rounds (best arm {d.best_arm}): speedup "
        f"{_fmt(d.speedup, '.3f')} (interval{interval or ' -'}), accept length {_fmt(d.accept_length)}, gain over "
        f"champion {_fmt(d.gain_over_champion, '.3f')} (interval{gain or ' -'})"
    ]
    lines += [f"  - check {'ok' if c['ok'] else 'FAILED'}: {c['name']}: {c['message']}" for c in d.checks]
    lines += [f"  - {reason}" for reason in d.reasons]
    return lines


def _accept_lines(report: GateReport) -> list[str]:
    """Where each speculative level's accept length came from: the server's own field or computed, with the rate
    and histogram when the server sent them (``eagle3.bench.accept``)."""
    rows = [(arm, lv) for arm in report.arms for lv in arm.levels if lv.accept_source]
    if not rows:
        return []
    lines = ["", "## Accept counters (from the servers' answers)", "",
             "| arm | concurrency | accept length | from | accept rate | verify passes by accepted drafts | fields |",
             "|---|---:|---:|---|---:|---|---|"]  # fmt: skip
    for arm, lv in rows:
        hist = " ".join(map(str, lv.accept_histogram)) if lv.accept_histogram else "-"
        lines.append(f"| {arm.name} | {lv.concurrency} | {_fmt(lv.accept_length)} | {lv.accept_source} | "
                     f"{_fmt(lv.accept_rate)} | {hist} | {', '.join(lv.accept_fields)} |")  # fmt: skip
    return lines


def to_markdown(report: GateReport) -> str:
    t = report.thresholds
    lines = [
        f"# EAGLE-3 gate: {str(report.verdict).upper()}",
        "",
        f"target `{report.target}`, fingerprint `{report.fingerprint}`, prompts {report.prompts}",
        f"thresholds: speedup >= {t['min_speedup']}, accept length >= {t['min_accept']}, gain over champion >= "
        f"{t['min_gain_over_champion']} at concurrency {t['decision_concurrency']}; rounds {t.get('min_rounds')}.."
        f"{t.get('max_rounds')}, {t.get('confidence')} t interval on the paired per-round speedups",
        "",
        "| arm | role | concurrency | rounds | output tok/s (pooled) | TPOT ms | accept length | requests |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in report.arms:
        if arm.error:
            lines.append(f"| {arm.name} | {arm.role} | - | - | - | - | - | error: {arm.error} |")
        for lv in arm.levels:
            lines.append(
                f"| {arm.name} | {arm.role} | {lv.concurrency} | {len(arm.rounds_at(lv.concurrency))} | "
                f"{lv.output_tok_s:.1f} | {lv.tpot_ms:.1f} | {_fmt(lv.accept_length)} | {lv.requests} |"
            )
    lines += _accept_lines(report)
    lines += ["", "## Decisions", ""]
    for d in report.decisions:
        lines += _decision_lines(d)
    concurrencies = list(dict.fromkeys(r.concurrency for a in report.arms for r in a.rounds))
    if concurrencies:
        lines += ["", "## Rounds (output tok/s [accept length]; speedups = each speculative arm / baseline)", ""]
        for c in concurrencies:
            lines += _rounds_table(report, c)
    lines += ["", "## The accept-length bound", "", PHYSICAL_BOUND]
    unflushed = [f"- {arm.name}: {note}" for arm in report.arms for note in arm.flush_failures]
    if unflushed:
        lines += ["", "## Rounds measured without a cache flush", "", *unflushed]
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
            (line,) = ax.plot(xs, [lv.output_tok_s for lv in arm.levels], marker="o", label=arm.name)
            ax.scatter([r.concurrency for r in arm.rounds], [r.output_tok_s for r in arm.rounds], s=10, alpha=0.4,
                       color=line.get_color())  # each round, so the spread is visible  # fmt: skip
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tok/s")
    ax.set_xscale("log", base=2)
    ax.set_title("Throughput vs concurrency (line: pooled rounds, dots: each round)")
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
