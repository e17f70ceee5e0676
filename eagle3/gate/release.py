"""The benchmark gate: baseline vs speculative (vs champion) on the same prompts, then promote or
refuse (docs/DESIGN.md, "The gate").

Design choices:
- Refuse before measuring: each candidate draft first passes static preflight against the SGLang
  commands that would ship it; each launched (or given) speculative server then passes the runtime
  checks (``/server_info`` says EAGLE3 with this draft, a smoke run speculates). A refused draft is
  never benchmarked, so a broken launch line (``EAGLE`` instead of ``EAGLE3``) cannot produce a
  report that looks like a slow-but-valid draft.
- Every arm is up at once and the traffic alternates between them in rounds
  (``eagle3.gate.rounds``): the arms take turns, never share the machine while timed, and get the
  same rendered prompts; any failed request fails the arm, not a number. The rounds run once per
  ``gate.sampling`` profile on the same servers, each with its own verdict
  (``eagle3.gate.profiles``); before a profile that samples, each speculative server must show that
  it samples (``eagle3.gate.sampling_probe``), or it is not measured at that profile.
- Without URLs the gate launches the arms itself on ``server.engine`` (the reference server, or
  SGLang: on a GPU box, or on this CPU through the project's runtime), one server per (draft,
  speculative config) of ``gate.sweep`` (default: ``config.speculative``). Launched SGLang arms
  share the device, so when ``server.mem_fraction_static`` is unset each gets an equal share of
  ``SGLANG_MEMORY`` (the same for every arm, and in ``launch_used``; the shipped ``launch_sglang``
  line keeps the config's). With URLs it measures what is running; a sweep needs launching and is
  then not possible.
- The verdict per candidate (``eagle3.gate.verdict``): PASS, FAIL or INCONCLUSIVE on the traffic
  profile (``gate.traffic``) from the t intervals of the paired per-round speedups, per level and
  weighted, and the physical sanity checks. The gate passes iff some candidate passes; the best
  passing one is promoted; INCONCLUSIVE never promotes.
- The serving configuration (``eagle3.gate.recommend``): for the best candidate, SGLang's adaptive
  tiers and the command that serves with them (``best`` keeps the fastest static config's command).
- Output ``<root>/gate/<fp>/`` with a manifest written last; a finished gate (manifest present) is
  read back, not re-measured, unless ``force``.
- The fingerprint and directory are known before measuring (``gate_identity``), so the gate stage's
  plan (``eagle3.gate.stage``) names them without launching anything.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3.config.base import StrictModel
from eagle3.config.gate import SpeculativeConfig
from eagle3.config.pipeline import PipelineConfig
from eagle3.gate import preflight, preflight_runtime, profiles
from eagle3.gate.prompts import BenchPrompt, load_gate_prompts
from eagle3.gate.recommend import recommend
from eagle3.gate.report import PASS, ArmResult, Decision, GateReport, read_report, write_report
from eagle3.gate.rounds import ArmError
from eagle3.gate.sampling_probe import check_sampling
from eagle3.gate.verdict import overall
from eagle3.registry import Promotion, Registry, draft_id
from eagle3.rundir.layout import stage_dir
from eagle3.rundir.runroot import FileEntry, Manifest, fingerprint
from eagle3.runtime.stop import raise_if_stopped
from eagle3.serve.launch import LaunchError
from eagle3.serve.launch_commands import LaunchCommand, build_launch
from eagle3.stage import Frozen
from eagle3.target_io import load_tokenizer

logger = logging.getLogger(__name__)

SMOKE_PROMPTS = 4
SMOKE_TOKENS = 32
SGLANG_MEMORY = 0.85  # of the device, split over the SGLang arms the gate launches side by side


class GateRequest(Frozen):
    """What one gate is asked to do: the candidate exports; running servers to measure instead of
    launching arms (the baseline and speculative URLs together, and the champion's); the capture
    stage whose layer ids preflight checks; whether a PASS promotes; whether a finished gate is
    measured again (``force``). The gate stage's plan carries it, and the gate flow's parameters
    are its fields."""

    drafts: tuple[Path, ...]
    baseline_url: str | None = None
    spec_url: str | None = None
    champion_url: str | None = None
    features_dir: Path | None = None
    promote: bool = True
    force: bool = False


@dataclass
class GateResult:
    out_dir: Path
    report: GateReport
    paths: dict[str, Path] = field(default_factory=dict)
    reused: bool = False

    @property
    def passed(self) -> bool:
        return self.report.passed

    @property
    def verdict(self) -> str:
        return str(self.report.verdict)


def config_label(spec: SpeculativeConfig) -> str:
    return f"s{spec.num_steps}-k{spec.eagle_topk}-n{spec.num_draft_tokens}"


@contextlib.contextmanager
def serving(command: LaunchCommand | None, url: str | None, log_path: Path) -> Iterator[str]:
    """Yield a server URL: the given one, or one launched from ``command`` and stopped on exit."""
    if url:
        yield url.rstrip("/")
        return
    assert command is not None
    with command.server(log_path=log_path) as server:
        yield server.url


def _static_preflight(
    config: PipelineConfig, draft: Path, spec: SpeculativeConfig, features: Path | None
) -> list:
    port = config.server.port or 30000
    baseline = build_launch(config, "baseline", engine="sglang", port=port)
    shipped = build_launch(
        config, "eagle3", engine="sglang", draft=draft, speculative=spec, port=port
    )
    checks = preflight.run_static(
        config, draft, baseline=baseline, spec=shipped, features_dir=features
    )
    # a damaged draft fails here, before any server
    if features is not None and not preflight.failed(checks):
        checks += preflight.run_offline(config, draft, features)
    return checks


def _runtime_preflight(
    arm: ArmResult, url: str, prompts: list[BenchPrompt], config: PipelineConfig
) -> None:
    smoke = [list(p.input_ids) for p in prompts[:SMOKE_PROMPTS]]
    checks = preflight_runtime.run_runtime(
        url,
        smoke,
        export_dir=arm.draft,
        max_new_tokens=SMOKE_TOKENS,
        min_accept=min(preflight.SMOKE_MIN_ACCEPT, config.gate.min_accept),
    )
    arm.preflight = [c.to_dict() for c in checks]
    bad = preflight.failed(checks)
    if bad:
        raise ArmError("runtime preflight failed: " + "; ".join(c.line() for c in bad))


@dataclass
class _Plan:
    """Every arm to measure, with how to reach it."""

    arms: list[ArmResult]
    commands: dict[str, LaunchCommand | None]
    urls: dict[str, str | None]


def _side_by_side(config: PipelineConfig, arms: int) -> PipelineConfig:
    """The config of the launched arms: SGLang arms up together share the device (see the module
    docstring)."""
    if config.server.engine != "sglang" or config.server.mem_fraction_static is not None:
        return config
    return config.replace(
        server=config.server.replace(mem_fraction_static=round(SGLANG_MEMORY / arms, 3))
    )


def _plan(
    config: PipelineConfig,
    drafts: list[Path],
    champion: Promotion | None,
    *,
    baseline_url: str | None,
    spec_url: str | None,
    champion_url: str | None,
) -> _Plan:
    plan = _Plan([], {}, {})
    champion_arm = champion is not None and champion.draft_id not in {draft_id(d) for d in drafts}
    arms = 1 + len(drafts) * len(config.gate.sweep or [config.speculative]) + champion_arm
    measured = _side_by_side(config, arms)

    def add(
        arm: ArmResult, url: str | None, draft: Path | None, spec: SpeculativeConfig | None
    ) -> None:
        kind = "baseline" if spec is None else "eagle3"
        command = (
            None if url else build_launch(measured, kind, draft=draft, speculative=spec, port=0)
        )
        arm.launch_used = f"(given) {url}" if url or command is None else command.shell()
        arm.launch_sglang = build_launch(
            config,
            kind,
            engine="sglang",
            draft=draft,
            speculative=spec,
            port=config.server.port or 30000,
        ).shell()
        plan.arms.append(arm)
        plan.commands[arm.name], plan.urls[arm.name] = command, url

    add(ArmResult("baseline", "baseline", baseline_url or ""), baseline_url, None, None)
    configs = [config.speculative] if spec_url else (config.gate.sweep or [config.speculative])
    if spec_url and config.gate.sweep:
        logger.warning(
            "gate.sweep needs launching the arms; with --spec-url only the running config is measured"
        )
    for i, draft in enumerate(drafts):
        for spec in configs:
            name = f"cand{i}:{config_label(spec)}"
            arm = ArmResult(
                name, "candidate", spec_url or "", str(draft), draft_id(draft), config_label(spec)
            )
            arm.speculative = spec.model_dump(mode="json")
            add(arm, spec_url, draft, spec)
    if champion is not None and champion_arm:
        spec = (
            SpeculativeConfig(**champion.speculative)
            if champion.speculative
            else config.speculative
        )
        arm = ArmResult(
            f"champion:{config_label(spec)}", "champion", champion_url or "", champion.draft_dir
        )
        arm.draft_id, arm.config_label = champion.draft_id, config_label(spec)
        arm.speculative = spec.model_dump(mode="json")
        if spec_url and not champion_url:
            arm.error = "a champion exists but no --champion-url was given: it cannot be measured"
            plan.arms.append(arm)
        else:
            add(arm, champion_url, Path(champion.draft_dir), spec)
    plan.arms = profiles.expand(plan.arms, config.gate)
    return plan


def gate_fingerprint(
    config: PipelineConfig, drafts: list[Path], champion: Promotion | None, urls: dict[str, Any]
) -> str:
    """Identity of one gate. A champion that is one of the candidates is not measured as its own arm
    (``_plan``), so it plays no part: re-gating the draft a gate just promoted reuses that gate's
    report instead of measuring again.
    """
    ids = [draft_id(d) for d in drafts]
    return fingerprint(
        "gate",
        config.target.model_dump(mode="json"),
        _set_fields(config.server, ("log_requests",)),
        config.speculative.model_dump(mode="json"),
        config.gate.identity(),
        ids,
        champion.draft_id if champion and champion.draft_id not in ids else None,
        urls,
    )


def _set_fields(section: StrictModel, later: tuple[str, ...]) -> dict[str, Any]:
    """``section`` as JSON, its ``later`` fields (added after gates were recorded) only when not
    at their default, so a gate recorded before them keeps its fingerprint."""
    dumped = section.model_dump(mode="json")
    fields = type(section).model_fields
    defaults = {k: fields[k].get_default(call_default_factory=True) for k in later}
    return {k: v for k, v in dumped.items() if k not in later or v != defaults[k]}


def _refusals(
    config: PipelineConfig, drafts: list[Path], features: Path | None
) -> dict[str, list[str]]:
    refused: dict[str, list[str]] = {}
    for draft in drafts:
        for spec in config.gate.sweep or [config.speculative]:
            bad = preflight.failed(_static_preflight(config, draft, spec, features))
            lines = [f"static preflight ({config_label(spec)}) {c.line()}" for c in bad]
            if lines:
                refused.setdefault(str(draft), []).extend(lines)
    return refused


def _sampling_probe(
    arms: list[ArmResult], prompts: list[BenchPrompt], config: PipelineConfig
) -> profiles.Probe:
    """The check run on each speculative arm before a profile that samples: its line, or None when
    it samples."""
    base = next((a for a in arms if a.role == "baseline" and a.error is None), None)
    smoke = [list(p.input_ids) for p in prompts[:SMOKE_PROMPTS]]

    def probe(arm: ArmResult, name: str) -> str | None:
        profile = config.gate.sampling[name]
        candidates = [profile.params(), *profile.sets.values()]
        params = next((s for s in candidates if not s.greedy), candidates[0])
        if base is None:
            return None  # nothing is measured without a baseline
        check = check_sampling(arm.url, base.url, smoke, params, max_new_tokens=SMOKE_TOKENS)
        arm.preflight.append(check.to_dict())
        return None if check.ok else f"sampling preflight failed: {check.line()}"

    return probe


def _measure_plan(
    plan: _Plan, prompts: list[BenchPrompt], config: PipelineConfig, *, refused: dict, out_dir: Path
) -> float:
    """Bring every arm up (launched or given; speculative ones pass the runtime preflight), then
    measure the live ones in interleaved rounds until the verdict settles, profile by profile
    (``eagle3.gate.profiles``); servers stop on the way out. Returns the seconds the rounds took."""
    with contextlib.ExitStack() as stack:
        for arm in profiles.of_profile(plan.arms, profiles.primary(config.gate)):
            if arm.error:
                continue
            if arm.role == "candidate" and arm.draft in refused:
                arm.error = "refused by static preflight, not measured"
                continue
            log = out_dir / "logs" / f"{arm.name.replace(':', '-')}.log"
            try:
                arm.url = stack.enter_context(
                    serving(plan.commands[arm.name], plan.urls[arm.name], log)
                )
                if arm.role != "baseline":
                    _runtime_preflight(arm, arm.url, prompts, config)
            except (ArmError, LaunchError, OSError) as exc:
                arm.error = str(exc)
                logger.error("arm %s failed: %s", arm.name, exc)
        profiles.share_servers(plan.arms, config.gate)
        start = time.perf_counter()
        probe = _sampling_probe(plan.arms, prompts, config)
        profiles.measure(plan.arms, prompts, config.gate, refused, probe)
        return time.perf_counter() - start


def _best_decision(decisions: list[Decision]) -> Decision | None:
    """The promoted candidate: the fastest passing one on the profile; else the fastest measured
    one."""
    measured = [d for d in decisions if d.best_arm is not None and d.speedup is not None]
    passing = [d for d in measured if d.passed]
    return max(passing or measured, key=lambda d: d.speedup or 0.0, default=None)


def _promote(registry: Registry, report: GateReport, out_dir: Path) -> dict[str, Any] | None:
    winner = _best_decision(report.decisions)
    if winner is None or not winner.passed:
        return None
    arm = next(a for a in report.arms if a.name == winner.best_arm)
    if registry.champion() is not None and registry.champion().draft_id == arm.draft_id:  # type: ignore[union-attr]
        return None
    metrics = {
        "speedup": winner.speedup,
        "speedup_interval": winner.speedup_interval,
        "rounds": winner.rounds,
        "accept_length": winner.accept_length,
        "traffic": report.thresholds.get("traffic"),
        "sampling": report.sampling_rows(winner),
        "levels": {lv.concurrency: lv.speedup for lv in winner.levels},
        "output_tok_s": {lv.concurrency: lv.output_tok_s for lv in arm.levels},
    }
    promotion = registry.promote(
        Path(winner.draft),
        report=out_dir / "report.json",
        metrics=metrics,
        speculative=arm.speculative,
    )
    return asdict(promotion)


def _cost(arms: list[ArmResult], measure_s: float) -> dict[str, Any]:
    measured = [a for a in arms if a.rounds]
    return {
        "rounds": len({r.round for a in measured for r in a.rounds}),
        "levels": len({r.concurrency for a in measured for r in a.rounds}),
        "arms": len(measured),
        "batches": sum(len(a.rounds) for a in measured),
        "measure_s": round(measure_s, 3),
    }


@dataclass(frozen=True)
class _Measured:
    """What ``run_gate`` measured: the arms, their decisions, the prompts and the seconds the rounds
    took."""

    arms: list[ArmResult]
    decisions: list[Decision]
    prompts: list[BenchPrompt]
    measure_s: float


def _report(
    config: PipelineConfig, fp: str, measured: _Measured, champion: Promotion | None, out_dir: Path
) -> GateReport:
    """The report; ``best`` is the best decision's arm with its launch commands, ``adaptive`` its
    serving config."""
    decisions, arms = measured.decisions, measured.arms
    winner = _best_decision(decisions)
    best = next((a for a in arms if winner is not None and a.name == winner.best_arm), None)
    best_info = None
    if best is not None:
        best_info = {
            "arm": best.name,
            "draft": best.draft,
            "speculative": best.speculative,
            "launch_sglang": best.launch_sglang,
            "launch_used": best.launch_used,
        }
    return GateReport(
        fingerprint=fp,
        target=config.target.model_path,
        thresholds=config.gate.model_dump(mode="json", exclude={"sweep", "prompt_sets"}),
        prompts={
            name: sum(p.set_name == name for p in measured.prompts)
            for name in sorted(config.gate.prompt_sets)
        },
        arms=arms,
        decisions=decisions,
        passed=overall(decisions) == PASS,
        verdict=overall(decisions),
        best=best_info,
        champion=asdict(champion) if champion else None,
        created_at=time.time(),
        adaptive=recommend(config, arms, winner, out_dir),
        cost=_cost(arms, measured.measure_s),
        sampling=profiles.describe(config.gate),
    )


@dataclass(frozen=True)
class GateIdentity:
    """What a gate measures and where it writes, known before measuring: a stage plan computes it
    cheaply."""

    drafts: list[Path]
    champion: Promotion | None
    urls: dict[str, str | None]
    fingerprint: str
    out_dir: Path


def gate_identity(config: PipelineConfig, request: GateRequest) -> GateIdentity:
    """The validated drafts, today's champion, the URLs, and the gate's fingerprint and
    directory."""
    paths = [Path(d).expanduser().resolve() for d in request.drafts]
    if not paths:
        raise ValueError("pass at least one --draft <export dir>")
    if bool(request.baseline_url) != bool(request.spec_url):
        raise ValueError(
            "pass both --baseline-url and --spec-url (measure running servers) or neither (launch them)"
        )
    champion = Registry(config.root_path).champion()
    urls = {
        "baseline": request.baseline_url,
        "spec": request.spec_url,
        "champion": request.champion_url,
    }
    fp = gate_fingerprint(config, paths, champion, urls)
    return GateIdentity(paths, champion, urls, fp, stage_dir(config.root_path, "gate", fp))


def gate_prompts(config: PipelineConfig, *, per_set: int | None = None) -> list[BenchPrompt]:
    """The gate's prompt sets rendered with the target's tokenizer, ``per_set`` prompts of each
    (default ``gate.prompts_per_set``)."""
    per_set = config.gate.prompts_per_set if per_set is None else per_set
    tokenizer = load_tokenizer(config.target)
    return load_gate_prompts(config.gate.prompt_sets, tokenizer, per_set=per_set)


def run_gate(config: PipelineConfig, request: GateRequest) -> GateResult:
    """Benchmark the drafts against the baseline (and the champion), decide, report, promote the
    best passing one."""
    gate = gate_identity(config, request)
    paths, fp, out_dir = gate.drafts, gate.fingerprint, gate.out_dir
    if not request.force and Manifest.read(out_dir) is not None:
        logger.info("gate %s already done, reading its report", fp)
        return GateResult(out_dir, read_report(out_dir), reused=True)
    refused = _refusals(config, paths, request.features_dir)
    plan = _plan(
        config,
        paths,
        gate.champion,
        baseline_url=request.baseline_url,
        spec_url=request.spec_url,
        champion_url=request.champion_url,
    )
    prompts: list[BenchPrompt] = []
    measure_s = 0.0
    if len(refused) < len(paths):  # every candidate refused statically: nothing worth measuring
        prompts = gate_prompts(config)
        measure_s = _measure_plan(plan, prompts, config, refused=refused, out_dir=out_dir)
    else:
        plan.arms = []
        logger.error("every candidate failed static preflight; no arm was launched")
    decisions = profiles.decide_profiles(plan.arms, config.gate, refused)
    measured = _Measured(plan.arms, decisions, prompts, measure_s)
    # a stopped gate writes no report, manifest or promotion: a re-run measures again
    raise_if_stopped("the gate")
    report = _report(config, fp, measured, gate.champion, out_dir)
    if request.promote:
        report.promotion = _promote(Registry(config.root_path), report, out_dir)
    files = write_report(report, out_dir)
    if report.adaptive and report.adaptive["config_path"]:
        files["adaptive_json"] = Path(report.adaptive["config_path"])
    Manifest(
        "gate",
        fp,
        files=[FileEntry.of(p, rows=0, base=out_dir) for p in files.values()],
        config={"gate": config.gate.model_dump(mode="json"), "urls": gate.urls},
        stats={
            "passed": report.passed,
            "verdict": report.verdict,
            "promoted": bool(report.promotion),
        },
    ).write(out_dir)
    logger.info("gate %s: %s (report %s)", fp, str(report.verdict).upper(), files["markdown"])
    return GateResult(out_dir, report, files)
