"""The gate report in Markdown (``report.md``, and the ``gate-report`` artifact): the verdict, the
traffic profile and the sampling each verdict was measured at, each level's verdict, the crossover,
accept length per prompt set, the rounds, the emitted SGLang adaptive config with its launch
command, and the derivation of the accept-length bound."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagle3.gate.report import Decision, GateReport

# The accept_bound check's derivation (``eagle3.gate.verdict``), printed in every report.
PHYSICAL_BOUND = (
    "Chain speculation with k draft steps: one cycle is a target verify forward over k+1 positions (cost T_v) plus "
    "k draft forwards (cost k*T_d) and emits a tokens on average (a = accept length, bonus token included); the "
    "baseline emits one token per target decode step (cost T) at the same batch. A verify step computes a superset "
    "of a decode step, so T_v >= T, and T_d >= 0, hence speedup = a*T / (T_v + k*T_d) <= a*T / T_v <= a. Prefill "
    "costs both arms the same and only pulls the ratio toward 1 (<= a since a >= 1). A tree (topk > 1) verifies "
    "more positions per step and obeys the same bound. So a round whose speedup exceeds a*(1 + tolerance) measured "
    "the machine, not the draft."
)


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _span(interval: list[float] | None) -> str:
    return "-" if not interval else f"{interval[0]:.3f}..{interval[1]:.3f}"


def profile_line(t: dict[str, Any]) -> str:
    """The traffic profile as ``1: 80%, 4: 20%`` (weights normalized)."""
    traffic = {int(c): float(w) for c, w in (t.get("traffic") or {}).items()}
    total = sum(traffic.values()) or 1.0
    return ", ".join(f"{c}: {w / total:.0%}" for c, w in sorted(traffic.items()))


def sampling_line(report: GateReport) -> str:
    """Which sampling the verdicts were measured at: ``greedy: greedy (decides); served: T=1
    top_p=0.95 ...``."""
    return "; ".join(
        f"{name}: {p['label']} ({'decides' if p['decides'] else 'reported only'}"
        + (f", concurrency {', '.join(str(c) for c in p['traffic'])})" if p.get("traffic") else ")")
        for name, p in report.sampling.items()
    )


def _rounds_table(report: GateReport, c: int, sampling: str | None) -> list[str]:
    """Per-round tok/s of every arm at concurrency ``c`` and one sampling profile (accept length of
    speculative arms in brackets)."""
    arms = [a for a in report.arms if a.rounds_at(c) and a.sampling == sampling]
    if not arms:
        return []
    base = next((a.rounds_at(c) for a in arms if a.role == "baseline"), {})
    title = f"### Concurrency {c}" + (f", {sampling}" if len(report.sampling) > 1 else "")
    lines = [
        title,
        "",
        "| round | " + " | ".join(a.name for a in arms) + " | speedups |",
        "|---:|" + "---:|" * (len(arms) + 1),
    ]
    for r in sorted({r for a in arms for r in a.rounds_at(c)}):
        cells, ratios = [], []
        for a in arms:
            stats = a.rounds_at(c).get(r)
            cells.append(
                "-"
                if stats is None
                else f"{stats.output_tok_s:.1f}"
                + (f" [{stats.accept_length:.2f}]" if stats.accept_length else "")
            )
            if stats and a.role != "baseline" and r in base and base[r].output_tok_s:
                ratios.append(f"{stats.output_tok_s / base[r].output_tok_s:.3f}")
        lines.append(f"| {r} | " + " | ".join(cells) + f" | {', '.join(ratios) or '-'} |")
    return [*lines, ""]


def _levels_table(d: Decision) -> list[str]:
    if not d.levels:
        return []
    lines = [
        "",
        "  | concurrency | share | rounds | speedup | interval | verdict | vs baseline |",
        "  |---:|---:|---:|---:|---|---|---|",
    ]
    for lv in d.levels:
        faster = lv.speedup_interval is not None and lv.speedup_interval[0] > 1.0
        versus = "**slower**" if lv.slower else "faster" if faster else "not shown different"
        lines.append(
            f"  | {lv.concurrency} | {lv.share:.0%} | {lv.rounds} | {_fmt(lv.speedup, '.3f')} | "
            f"{_span(lv.speedup_interval)} | {lv.verdict.upper()} | {versus} |"
        )
    return [*lines, ""]


def _profile_lines(report: GateReport, d: Decision) -> list[str]:
    """With several sampling profiles: each one's verdict, measured at its sampling."""
    if not d.profiles:
        return []
    lines = ["  - verdict per sampling profile:"]
    for row in report.sampling_rows(d):
        role = "decides" if row["decides"] else "reported only"
        lines.append(
            f"    - {row['name']} ({row['label']}, {role}): **{str(row['verdict']).upper()}**, "
            f"speedup {_fmt(row['speedup'], '.3f')} (interval {_span(row['interval'])}), accept "
            f"length {_fmt(row['accept_length'])}"
        )
    return lines


def _decision_lines(d: Decision, report: GateReport | None = None) -> list[str]:
    at = ""
    if report is not None and d.sampling in report.sampling:
        at = f" at {d.sampling} ({report.sampling[d.sampling]['label']})"
    lines = [
        f"- `{d.draft}`: **{str(d.verdict).upper()}**{at} after {d.rounds} rounds "
        f"(best arm {d.best_arm}): weighted "
        f"speedup {_fmt(d.speedup, '.3f')} (interval {_span(d.speedup_interval)}), accept length "
        f"{_fmt(d.accept_length)}, gain over champion {_fmt(d.gain_over_champion, '.3f')} (interval "
        f"{_span(d.gain_interval)})"
    ]
    lines += _profile_lines(report, d) if report is not None else []
    if d.crossover:
        lines.append(f"  - crossover: {d.crossover['summary']}")
    lines += [f"  - {reason}" for reason in d.reasons]
    lines += [f"  - warning: {warning}" for warning in d.warnings]
    lines += _levels_table(d)
    lines += [
        f"  - check {'ok' if c['ok'] else 'FAILED'}: {c['name']}: {c['message']}" for c in d.checks
    ]
    return lines


def _accept_lines(report: GateReport) -> list[str]:
    """Where each speculative level's accept length came from: the server's own field or computed,
    with the rate and histogram when the server sent them (``eagle3.gate.accept``)."""
    rows = [(arm, lv) for arm in report.arms for lv in arm.levels if lv.accept_source]
    if not rows:
        return []
    lines = [
        "",
        "## Accept counters (from the servers' answers)",
        "",
        "| arm | concurrency | accept length | from | accept rate | verify passes by accepted drafts | fields |",
        "|---|---:|---:|---|---:|---|---|",
    ]
    for arm, lv in rows:
        hist = " ".join(map(str, lv.accept_histogram)) if lv.accept_histogram else "-"
        lines.append(
            f"| {arm.name} | {lv.concurrency} | {_fmt(lv.accept_length)} | {lv.accept_source} | "
            f"{_fmt(lv.accept_rate)} | {hist} | {', '.join(lv.accept_fields)} |"
        )
    return lines


def _by_set_lines(report: GateReport) -> list[str]:
    rows = [(d, name, row) for d in report.decisions for name, row in d.by_set.items()]
    if not rows:
        return []
    lines = [
        "",
        "## Accept length per prompt set (each draft's best arm, every level and round)",
        "",
        "| draft | set | accept length | verify passes | completion tokens | prompts | requests |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for d, name, row in rows:
        lines.append(
            f"| {d.best_arm} | {name} | {_fmt(row['accept_length'])} | {row['spec_verify_ct']} | "
            f"{row['completion_tokens']} | {row['prompts']} | {row['requests']} |"
        )
    return lines


def _adaptive_lines(adaptive: dict[str, Any] | None) -> list[str]:
    if not adaptive:
        return []
    lines = [
        "",
        "## Serving configuration (SGLang adaptive speculation)",
        "",
        adaptive["summary"],
        "",
        "| batch size from | measured at concurrency | candidate steps | why |",
        "|---:|---:|---|---|",
    ]
    for tier in adaptive["tiers"]:
        steps = ", ".join(map(str, tier["candidate_steps"]))
        lines.append(
            f"| {tier['batch_size']} | {tier['concurrency']} | {steps} | {tier['reason']} |"
        )
    if adaptive.get("config") is not None:
        lines += [
            "",
            f"`--speculative-adaptive-config` ({adaptive['config_path']}):",
            "",
            "```json",
            json.dumps(adaptive["config"]),
            "```",
        ]
    return [*lines, "", "SGLang launch command:", "", "```", str(adaptive["launch_sglang"]), "```"]


def _header(report: GateReport) -> list[str]:
    t = report.thresholds
    lines = [
        f"# EAGLE-3 gate: {str(report.verdict).upper()}",
        "",
        f"target `{report.target}`, fingerprint `{report.fingerprint}`, prompts {report.prompts}",
        f"traffic profile (concurrency: share): {profile_line(t) or '-'}; thresholds: weighted speedup >= "
        f"{t['min_speedup']}, no level carrying >= {t.get('level_weight_floor', 0):.0%} of the traffic slower than "
        f"the baseline, accept length >= {t['min_accept']}, gain over champion >= {t['min_gain_over_champion']}; "
        f"rounds {t.get('min_rounds')}..{t.get('max_rounds')}, {t.get('confidence')} t interval on the paired "
        "per-round speedups",
    ]
    if t.get("profile_note"):
        lines.append(f"traffic profile built {t['profile_note']}")
    if report.sampling:
        profiles = sampling_line(report)
        lines.append(f"sampling (each profile measured at its levels, own verdict): {profiles}")
    if report.cost:
        c = report.cost
        lines.append(
            f"cost: {c['rounds']} rounds x {c['levels']} levels x {c['arms']} arms = {c['batches']} timed "
            f"batches, measured in {c['measure_s']:.0f} s"
        )
    return lines


def to_markdown(report: GateReport) -> str:
    lines = [
        *_header(report),
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
    lines += ["", "## Decisions", ""]
    for d in report.decisions:
        lines += _decision_lines(d, report)
    lines += _adaptive_lines(report.adaptive)
    lines += _by_set_lines(report)
    lines += _accept_lines(report)
    concurrencies = sorted({r.concurrency for a in report.arms for r in a.rounds})
    if concurrencies:
        lines += [
            "",
            "## Rounds (output tok/s [accept length]; speedups = each speculative arm / baseline)",
            "",
        ]
        for sampling in dict.fromkeys(a.sampling for a in report.arms):
            for c in concurrencies:
                lines += _rounds_table(report, c, sampling)
    lines += ["", "## The accept-length bound", "", PHYSICAL_BOUND]
    unflushed = [f"- {arm.name}: {note}" for arm in report.arms for note in arm.flush_failures]
    if unflushed:
        lines += ["", "## Rounds measured without a cache flush", "", *unflushed]
    if report.best:
        lines += [
            "",
            "## Best static config",
            "",
            f"`{json.dumps(report.best.get('speculative'))}`",
            "",
        ]
        lines += ["SGLang launch command:", "", "```", str(report.best.get("launch_sglang")), "```"]
    if report.promotion:
        lines += [
            "",
            f"Promoted draft `{report.promotion['draft_id']}` to champion ({report.promotion['draft_dir']}).",
        ]
    elif report.champion:
        lines += ["", f"Champion unchanged: `{report.champion.get('draft_id')}`."]
    return "\n".join(lines) + "\n"


def serving_lines(summary: dict[str, Any]) -> list[str]:
    """Markdown list lines of ``GateReport.serving_summary()`` (as found in the gate stage's
    summary): each level's speedup and verdict, the crossover, the warnings and the command serving
    with the emitted adaptive config."""
    levels = "; ".join(
        f"{lv['concurrency']} ({lv['share']:.0%}): {_fmt(lv['speedup'], '.2f')}x [{_span(lv['interval'])}] "
        f"{str(lv['verdict']).upper()}{', slower' if lv['slower'] else ''}"
        for lv in summary.get("levels") or []
    )
    lines = (
        [f"  - levels (concurrency (share): speedup [interval] verdict): {levels}"]
        if levels
        else []
    )
    lines += [
        f"  - at {row['name']} ({row['label']}, "
        f"{'decides' if row['decides'] else 'reported only'}): {str(row['verdict']).upper()}, "
        f"speedup {_fmt(row['speedup'])}x [{_span(row['interval'])}], accept length "
        f"{_fmt(row['accept_length'])}"
        for row in summary.get("sampling") or []
    ]
    if summary.get("crossover"):
        lines.append(f"  - crossover: {summary['crossover']['summary']}")
    lines += [f"  - warning: {w}" for w in summary.get("warnings") or []]
    if summary.get("adaptive_launch"):
        where = (
            f" (SGLang adaptive config `{summary['adaptive_config']}`)"
            if summary.get("adaptive_config")
            else ""
        )
        lines.append(f"  - serve{where}: `{summary['adaptive_launch']}`")
    return lines
