"""Gate results: per-arm, per-concurrency measurements, the decision, and the report files (JSON,
Markdown, PNG).

Design choices:
- Accept length of a level comes from its timed requests' own counters (``eagle3.gate.accept``:
  SGLang's ``spec_accept_length`` when every request sent it, else ``sum(completion_tokens) /
  sum(spec_verify_ct)``; never the server's cumulative average), and the level says which fields it
  used; output tok/s is completion tokens over the level's wall time; TPOT is the mean over requests
  of ``latency / completion_tokens`` (non-streaming, so it includes the prefill share).
- Every arm keeps each round it measured (``ArmResult.rounds``, one ``LevelStats`` per concurrency
  and round) and its rounds pooled per concurrency (``ArmResult.levels``, for the table and the
  throughput plot). The rounds and the thresholds in the JSON are all ``eagle3.gate.verdict.decide``
  needs: a verdict can be recomputed offline.
- A verdict is PASS, FAIL or INCONCLUSIVE; ``passed`` (what promotes) is derived from it and kept as
  a field so readers of the JSON (the scaling curve, scripts) need not know the verdicts. A
  ``Decision`` is on the traffic profile (``gate.traffic``): its ``speedup`` is the weighted one,
  ``levels`` holds each level's own verdict (``LevelVerdict``), ``crossover`` where speculation
  stops paying (``eagle3.gate.serving.Crossover`` as a dict), ``warnings`` the levels slower than
  the baseline that did not block a PASS.
- ``GateReport.adaptive``: the SGLang adaptive configuration emitted from the levels
  (``eagle3.gate.release``): ``{"draft", "tiers": [{batch_size, concurrency, candidate_steps,
  reason}], "config": <the JSON SGLang reads, or None>, "config_path", "launch_sglang",
  "summary"}``. ``GateReport.cost``: what the measurement took (``{"rounds", "levels", "arms",
  "batches", "measure_s"}``).
- **Accept length per prompt set** (``by_set``), for the night planner:
  ``report.json["decisions"][i]["by_set"]`` is the draft's best arm pooled over every level and
  round, ``{set: {"accept_length": float, "completion_tokens": int, "spec_verify_ct": int,
  "prompts": int, "requests": int, "accept_source": str}}`` (``prompts``: the set's prompts;
  ``requests``: timed requests counted; ``accept_source`` as for a level). Each round of a
  speculative arm carries the same mapping for that round (``arms[j]["rounds"][k]["by_set"]``).
  Drafts that did not speculate (not measured, refused) have ``{}``.
- **Sampling** (``gate.sampling``): every arm is measured once per profile (``ArmResult.sampling``
  names it; the first deciding profile's arms keep their plain names, the others' are
  ``<arm>@<profile>``). A ``Decision`` is the first deciding profile's, with the verdict of every
  deciding profile combined (``eagle3.gate.profiles``); ``Decision.sampling`` names the profile its
  numbers were measured at and, with several profiles, ``profiles`` holds each profile's own
  decision. ``GateReport.sampling`` describes the profiles (``{name: {"label", "decides",
  "traffic"}}``).
- The report is plain dataclasses serialised with ``asdict``; ``GateReport.from_dict`` reads one
  back so a finished gate is not re-measured on resume. Markdown: ``eagle3.gate.report_md``; plots:
  ``eagle3.gate.plots``.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3.gate.accept import (
    ACCEPT_LENGTH_FIELD,
    AcceptSummary,
    SpecCounts,
    pool,
    pool_rows,
    set_row,
)
from eagle3.gate.plots import plot_accept, plot_throughput
from eagle3.gate.prompts import RequestResult
from eagle3.gate.report_md import to_markdown
from eagle3.rundir.runroot import atomic_write_json, atomic_write_text

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
    # the server's spec_accept_length, or computed (eagle3.gate.accept)
    accept_source: str | None = None
    # the meta_info keys the counters came from
    accept_fields: list[str] = field(default_factory=list)
    accepted_drafts: int | None = None
    proposed_drafts: int | None = None
    accept_histogram: list[int] | None = None
    # per prompt set (module docstring), if speculating
    by_set: dict[str, dict[str, Any]] = field(default_factory=dict)
    completion_lengths: list[int] = field(default_factory=list)  # a round's, in prompt order
    output_digest: str | None = None  # a round's output ids in prompt order, hashed (None pooled)

    @property
    def accept_rate(self) -> float | None:
        return AcceptSummary(
            accepted_drafts=self.accepted_drafts, proposed_drafts=self.proposed_drafts
        ).accept_rate

    def counts(self) -> SpecCounts:
        """This level's counters as one answer's, to pool levels the way answers are pooled."""
        own = self.accept_length if self.accept_source == ACCEPT_LENGTH_FIELD else None
        hist = tuple(self.accept_histogram) if self.accept_histogram is not None else None
        return SpecCounts(
            self.completion_tokens,
            self.spec_verify_ct,
            own,
            self.accepted_drafts,
            self.proposed_drafts,
            hist,
            tuple(self.accept_fields),
        )

    @classmethod
    def _of(
        cls,
        concurrency: int,
        requests: int,
        tokens: int,
        duration: float,
        tpot_ms: float,
        spec: AcceptSummary,
        by_set: dict[str, dict[str, Any]],
    ) -> LevelStats:
        return cls(
            by_set=by_set if spec.verify_ct else {},
            concurrency=concurrency,
            requests=requests,
            completion_tokens=tokens,
            spec_verify_ct=spec.verify_ct,
            duration_s=duration,
            output_tok_s=tokens / duration if duration > 0 else 0.0,
            tpot_ms=tpot_ms,
            accept_length=spec.accept_length,
            accept_source=spec.source,
            accept_fields=list(spec.fields),
            accepted_drafts=spec.accepted_drafts,
            proposed_drafts=spec.proposed_drafts,
            accept_histogram=spec.histogram,
        )

    @classmethod
    def of(
        cls,
        concurrency: int,
        results: list[RequestResult],
        duration_s: float,
        *,
        sets: Sequence[str] = (),
    ) -> LevelStats:
        """One batch's level; ``sets`` names each result's prompt set (in order) to fill
        ``by_set``."""
        tokens = sum(r.completion_tokens for r in results)
        per_token = [r.latency_s / r.completion_tokens for r in results if r.completion_tokens > 0]
        tpot_ms = 1000.0 * sum(per_token) / len(per_token) if per_token else 0.0
        grouped: dict[str, list[SpecCounts]] = defaultdict(list)
        for name, result in zip(sets, results, strict=False):
            grouped[name].append(result.spec)
        by_set = {name: set_row(counts) for name, counts in sorted(grouped.items())}
        spec = pool([r.spec for r in results])
        level = cls._of(concurrency, len(results), tokens, duration_s, tpot_ms, spec, by_set)
        level.output_digest = output_digest([r.output_ids for r in results])
        level.completion_lengths = [r.completion_tokens for r in results]
        return level

    @classmethod
    def pooled(cls, rounds: list[LevelStats]) -> LevelStats:
        """One level from its rounds: token and time sums, request-weighted TPOT, the counters
        pooled."""
        requests = sum(r.requests for r in rounds)
        tpot_ms = sum(r.tpot_ms * r.requests for r in rounds) / requests if requests else 0.0
        return cls._of(
            rounds[0].concurrency,
            requests,
            sum(r.completion_tokens for r in rounds),
            sum(r.duration_s for r in rounds),
            tpot_ms,
            pool([r.counts() for r in rounds]),
            pool_sets(rounds),
        )


def output_digest(outputs: Sequence[Sequence[int]]) -> str:
    """A short hash of output ids in order: two rounds with the same digest produced the same
    tokens."""
    return hashlib.sha256(json.dumps([list(o) for o in outputs]).encode()).hexdigest()[:16]


def pool_sets(stats: Sequence[LevelStats]) -> dict[str, dict[str, Any]]:
    """The ``by_set`` entries of many levels or rounds pooled per set
    (``eagle3.gate.accept.pool_rows``)."""
    names = sorted({name for s in stats for name in s.by_set})
    return {name: pool_rows([s.by_set[name] for s in stats if name in s.by_set]) for name in names}


@dataclass
class ArmResult:
    """One measured server: ``role`` is baseline, candidate or champion; ``config_label`` names its
    spec config."""

    name: str
    role: str
    url: str
    draft: str | None = None
    draft_id: str | None = None
    config_label: str | None = None
    speculative: dict[str, Any] | None = None
    launch_used: str | None = None
    launch_sglang: str | None = None
    # pooled over rounds, one per concurrency
    levels: list[LevelStats] = field(default_factory=list)
    # every round at every concurrency, in measuring order
    rounds: list[LevelStats] = field(default_factory=list)
    preflight: list[dict[str, Any]] = field(default_factory=list)
    # rounds measured without a cache flush (bench.rounds)
    flush_failures: list[str] = field(default_factory=list)
    error: str | None = None
    sampling: str | None = None  # the gate.sampling profile these rounds were measured at

    def level(self, concurrency: int) -> LevelStats | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def rounds_at(self, concurrency: int) -> dict[int, LevelStats]:
        """This arm's rounds at one concurrency, by round number."""
        return {
            r.round: r for r in self.rounds if r.concurrency == concurrency and r.round is not None
        }

    def pool(self) -> None:
        """Set ``levels`` from ``rounds``: one pooled level per concurrency, in the order first
        measured."""
        order = list(dict.fromkeys(r.concurrency for r in self.rounds))
        self.levels = [
            LevelStats.pooled([r for r in self.rounds if r.concurrency == c]) for c in order
        ]

    def accept(self) -> AcceptSummary:
        """The accept counters of every round at every level pooled (``min_accept`` is checked on
        it)."""
        return pool([r.counts() for r in self.rounds])

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArmResult:
        data = dict(data)
        data["levels"] = [LevelStats(**lv) for lv in data.get("levels", [])]
        data["rounds"] = [LevelStats(**lv) for lv in data.get("rounds", [])]
        return cls(**data)


PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
VERDICTS: tuple[str, ...] = (PASS, FAIL, INCONCLUSIVE)


def _verdict_of(passed: bool, verdict: str | None) -> str:
    """``verdict`` checked against ``passed``; a report written without a verdict is PASS or
    FAIL."""
    verdict = verdict or (PASS if passed else FAIL)
    if verdict not in VERDICTS or passed != (verdict == PASS):
        raise ValueError(
            f"verdict {verdict!r} contradicts passed={passed} (verdicts: {list(VERDICTS)})"
        )
    return verdict


@dataclass
class LevelVerdict:
    """One level of the traffic profile for a draft's best arm, on its own: the paired speedup over
    the rounds of that level, its t interval, the verdict the interval gives against ``min_speedup``
    (and the level's checks), and ``slower``: the interval lies below 1, the draft is significantly
    slower than the baseline there."""

    concurrency: int
    share: float
    rounds: int
    speedup: float | None
    speedup_interval: list[float] | None
    verdict: str
    slower: bool = False
    accept_length: float | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Decision:
    """The verdict for one candidate draft on the traffic profile (its best spec config).

    ``speedup`` and ``gain_over_champion`` are weighted geometric means over the profile's levels of
    the per-round paired ratios, ``*_interval`` their t intervals (``eagle3.gate.stats``);
    ``accept_length`` is pooled over every level; ``checks`` are the physical sanity checks of every
    weighed level (name, ok, message, concurrency); ``reasons`` say why it did not pass,
    ``warnings`` what a PASS does not cover; ``levels``, ``crossover`` and ``by_set`` as in the
    module docstring.
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
    levels: list[LevelVerdict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    crossover: dict[str, Any] | None = None
    by_set: dict[str, dict[str, Any]] = field(default_factory=dict)
    sampling: str | None = None  # the gate.sampling profile the numbers above were measured at
    profiles: list[Decision] = field(default_factory=list)  # several profiles: each one's own

    def __post_init__(self) -> None:
        self.verdict = _verdict_of(self.passed, self.verdict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        data = dict(data)
        data["levels"] = [LevelVerdict(**lv) for lv in data.get("levels", [])]
        data["profiles"] = [Decision.from_dict(d) for d in data.get("profiles", [])]
        return cls(**data)

    def by_profile(self) -> list[Decision]:
        """Each profile's decision: ``profiles``, or this one when the gate measured one profile."""
        return self.profiles or [self]


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
    # the SGLang adaptive config emitted from the levels (module docstring)
    adaptive: dict[str, Any] | None = None
    # rounds, levels, arms, batches measured and the measuring time
    cost: dict[str, Any] | None = None
    # gate.sampling as measured: {name: {"label", "decides", "traffic"}}
    sampling: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.verdict = _verdict_of(self.passed, self.verdict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def serving_summary(self) -> dict[str, Any]:
        """What the gate says about serving, for summaries: the best candidate's levels (speedup,
        interval, verdict), crossover and warnings, and the emitted adaptive config with its
        command."""
        arm = (self.best or {}).get("arm")
        decision = next(
            (d for d in self.decisions if d.best_arm is not None and d.best_arm == arm), None
        )
        levels = [
            {
                "concurrency": lv.concurrency,
                "share": lv.share,
                "speedup": lv.speedup,
                "interval": lv.speedup_interval,
                "verdict": lv.verdict,
                "slower": lv.slower,
            }
            for lv in (decision.levels if decision else [])
        ]
        adaptive = self.adaptive or {}
        return {
            "levels": levels,
            "crossover": decision.crossover if decision else None,
            "warnings": decision.warnings if decision else [],
            "adaptive_config": adaptive.get("config_path"),
            "adaptive_launch": adaptive.get("launch_sglang"),
            "sampling": self.sampling_rows(decision),
        }

    def sampling_rows(self, decision: Decision | None) -> list[dict[str, Any]]:
        """Which sampling each of ``decision``'s verdicts was measured at: one row per profile
        (name, label, decides, verdict, speedup and interval, accept length)."""
        rows = []
        for d in decision.by_profile() if decision else []:
            profile = self.sampling.get(d.sampling or "", {})
            rows.append(
                {
                    "name": d.sampling,
                    # a report written before the gate had profiles measured greedily
                    "label": profile.get("label", d.sampling or "greedy"),
                    "decides": profile.get("decides", True),
                    "verdict": d.verdict,
                    "speedup": d.speedup,
                    "interval": d.speedup_interval,
                    "accept_length": d.accept_length,
                }
            )
        return rows

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GateReport:
        data = dict(data)
        data["arms"] = [ArmResult.from_dict(a) for a in data["arms"]]
        data["decisions"] = [Decision.from_dict(d) for d in data["decisions"]]
        return cls(**data)


def write_report(report: GateReport, out_dir: Path) -> dict[str, Path]:
    """Write report.json, report.md and the two plots into ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    paths = {
        "json": out_dir / REPORT_JSON,
        "markdown": out_dir / REPORT_MD,
        "throughput_png": out_dir / THROUGHPUT_PNG,
        "accept_png": out_dir / ACCEPT_PNG,
    }
    plot_throughput(report, paths["throughput_png"])
    plot_accept(report, paths["accept_png"])
    atomic_write_text(paths["markdown"], to_markdown(report))
    atomic_write_json(paths["json"], report.to_dict())
    return paths


def read_report(out_dir: Path) -> GateReport:
    return GateReport.from_dict(json.loads((Path(out_dir) / REPORT_JSON).read_text()))
