"""Tonight's aimed plan, end to end: the domain pool and its eval set, the champion's accept length
per domain, the curve's per-domain points, the allocation (``eagle3.scaling.allocation``), and the
rows it selects (``eagle3.scaling.selection``).

It sits above the gate because it measures a draft (``eagle3.scaling.domain_eval``, the registry's
champion) and reads the regen stage's shards for each domain's regenerated tokens; the rule itself
is ``eagle3.scaling.allocation`` (pure, no I/O).

Each domain's tokens per row come from its rows regenerated on earlier nights (the regen shards'
footers), else from its eval prompts' decoded tokens, else the mean of the other domains, else
``regen.max_new_tokens``.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from eagle3.config.pipeline import PipelineConfig
from eagle3.regen.plan import regen_dir_for
from eagle3.regen.shard import report_from_shard
from eagle3.registry import Registry
from eagle3.rundir.layout import shard_name
from eagle3.rundir.runroot import Manifest
from eagle3.scaling.allocation import DomainState, allocate, plan_markdown
from eagle3.scaling.curve import ScalingPoint, plan_night, previous_total, read_curve, shard_rows
from eagle3.scaling.domain_eval import DomainAccept, domain_accept
from eagle3.scaling.selection import (
    FREE,
    DomainPool,
    NightSelection,
    SelectionError,
    build_pool,
    pool_left,
    read_nights,
    read_pool,
    select_dir_for,
    taken,
    write_night,
)
from eagle3.scaling.served_accept import allocate_headroom
from eagle3.stage import Frozen, StageResult

logger = logging.getLogger(__name__)


class Night(Frozen):
    """Tonight's plan, what the nightly flow passes on: regen's input directory and shard ids, the
    totals, and the plan table with its Markdown (the ``night-plan`` artifact)."""

    policy: str
    prompts_dir: str  # regen's input: the prompts stage (uniform) or the selection (aimed)
    # aimed: the selection, whose eval set measures tonight's draft per domain
    select_dir: str | None = None
    night: int | None = None  # aimed: the night's number in the selection's ledger
    shard_ids: list[int]
    new_shard_ids: list[int]
    total_prompts: int
    pool_prompts: int
    exhausted: bool
    plan: list[dict[str, Any]] = Field(default_factory=list)
    plan_markdown: str

    @classmethod
    def of(cls, result: StageResult) -> Night:
        """The night a plan-night stage result carries (``eagle3.scaling.stage.PlanNightStage``)."""
        return cls.model_validate(result.summary)


@dataclass(frozen=True)
class AimedNight:
    """Tonight's plan (the table the allocation gave, or the one a recorded night showed) and its
    selection."""

    night: int
    table: list[dict[str, Any]]
    budget: float
    unit: str
    select_dir: Path
    champion: str | None  # the draft whose per-domain accept lengths the plan used
    selection: NightSelection | None = None  # None: planned only (``eagle3 plan``)
    notes: tuple[str, ...] = ()

    def markdown(self) -> str:
        head = f"## Night {self.night}: aimed plan\n\nChampion measured: `{self.champion or 'none yet'}`. "
        return head + plan_markdown(
            self.table, budget=self.budget, unit=self.unit, notes=self.notes
        )

    def summary(self) -> Night:
        """What the nightly flow passes on (regen's shards and input directory) and shows."""
        nights = [n for n in read_nights(self.select_dir) if n.night <= self.night]
        left, selected = (
            sum(pool_left(read_pool(self.select_dir), nights).values()),
            sum(taken(nights).values()),
        )
        return Night(
            policy="aimed",
            night=self.night,
            prompts_dir=str(self.select_dir),
            select_dir=str(self.select_dir),
            shard_ids=sorted(i for n in nights for i in n.shards),
            new_shard_ids=sorted(self.selection.shards) if self.selection else [],
            total_prompts=selected,
            pool_prompts=left + selected,
            exhausted=left == 0,
            plan=self.table,
            plan_markdown=self.markdown(),
        )


def _regen_stats(
    config: PipelineConfig, select_dir: Path, nights: list[NightSelection]
) -> dict[str, list[int]]:
    """Per domain: [rows regenerated, their completion tokens], from the regen shards' footers (none
    yet: {})."""
    if Manifest.read(select_dir) is None:
        return {}
    regen_dir = regen_dir_for(config, select_dir)
    out: dict[str, list[int]] = {}
    for night in nights:
        for index, domain in night.shards.items():
            path = regen_dir / shard_name(index)
            if domain == FREE or not path.exists():
                continue
            report = report_from_shard(path, index)
            row = out.setdefault(domain, [0, 0])
            row[0] += report.rows - report.pretokenized
            row[1] += report.completion_tokens
    return out


def _shares(config: PipelineConfig, domains: list[str]) -> dict[str, float]:
    traffic = config.scaling.traffic
    unknown = sorted(set(traffic) - set(domains))
    if unknown:
        raise SelectionError(
            f"scaling.traffic names {unknown}, which are not domains of the pool {domains}: "
            "fix the names (scaling.domain_key decides what a domain is)"
        )
    weights = {d: traffic.get(d, 0.0) if traffic else 1.0 for d in domains}
    total = sum(weights.values()) or 1.0
    return {d: w / total for d, w in weights.items()}


def _tokens_per_row(
    config: PipelineConfig,
    domains: list[str],
    regen: dict[str, list[int]],
    accept: dict[str, DomainAccept],
) -> dict[str, float]:
    known = {d: regen[d][1] / regen[d][0] for d in domains if regen.get(d, [0])[0] > 0}
    known |= {
        d: accept[d].tokens_per_prompt
        for d in domains
        if d not in known and d in accept and accept[d].prompts
    }
    fill = statistics.fmean(known.values()) if known else float(config.regen.max_new_tokens)
    return {d: known.get(d, fill) for d in domains}


def domain_points(curve: list[ScalingPoint]) -> dict[str, list[tuple[float, float]]]:
    """Per domain, the (training tokens, accept length) of every aimed night on the curve, oldest
    first."""
    out: dict[str, list[tuple[float, float]]] = {}
    for point in curve:
        for domain, row in point.domains.items():
            if row.get("accept") is not None:
                out.setdefault(domain, []).append((float(row["tokens"]), float(row["accept"])))
    return out


def domain_states(
    config: PipelineConfig, pool: DomainPool, accept: dict[str, DomainAccept]
) -> list[DomainState]:
    nights = read_nights(pool.dir)
    left, regen = pool_left(pool, nights), _regen_stats(config, pool.dir, nights)
    names = sorted(pool.refs)
    shares, per_row = _shares(config, names), _tokens_per_row(config, names, regen, accept)
    points, done = domain_points(read_curve(config.root_path)), taken(nights)
    states = []
    for d in names:
        trained = regen.get(d, [0, 0])
        # rows selected but not regenerated yet
        estimated = trained[1] + (done.get(d, 0) - trained[0]) * per_row[d]
        states.append(
            DomainState(
                name=d,
                pool_left=left[d],
                tokens_per_row=per_row[d],
                share=shares[d],
                accept=accept[d].accept_length if d in accept else None,
                points=tuple(points.get(d, ())),
                trained_tokens=estimated,
            )
        )
    if pool.free:
        states.append(
            DomainState(name=FREE, pool_left=left[FREE], tokens_per_row=0.0, share=0.0, free=True)
        )
    return states


def champion_accept(
    config: PipelineConfig, pool: DomainPool
) -> tuple[str | None, dict[str, DomainAccept]]:
    """The champion's accept length per domain (measured once per draft); before any promotion, the
    last aimed night's draft as its curve point recorded it (a gate that refuses every night still
    leaves measurements)."""
    champion = Registry(config.root_path).champion()
    if champion is not None:
        return champion.draft_dir, domain_accept(config, Path(champion.draft_dir), pool)
    last = next((p for p in reversed(read_curve(config.root_path)) if p.domains), None)
    if last is None:
        return None, {}
    accept = {
        d: DomainAccept(float(row["accept"]), 0, 0, 0)
        for d, row in last.domains.items()
        if row.get("accept") is not None
    }
    return f"no champion yet: the draft of {last.report}", accept


def served_domain_accept(config: PipelineConfig) -> dict[str, DomainAccept]:
    """The live draft's accept length per domain from the served sources' request logs
    (``scaling.aim=served``)."""
    from eagle3.gate.served_profile import served_files
    from eagle3.scaling.served_accept import served_accept

    measured = served_accept(served_files(config), header=config.scaling.served_domain_header)
    return {
        d: DomainAccept(m.accept_length, m.tokens, m.verify_ct, m.requests)
        for d, m in measured.items()
    }


def plan_aimed(
    config: PipelineConfig, prompts_dir: Path, budget: float | None, *, write: bool
) -> AimedNight:
    """Tonight's aimed plan over a finished prompts stage; ``write`` selects its rows. A night
    already in the ledger (run again after a crash) keeps the rows and the plan it recorded.
    ``budget`` None: every row left."""
    pool = build_pool(config, Path(prompts_dir))
    night = len(read_curve(config.root_path)) + 1
    recorded = {n.night: n for n in read_nights(pool.dir)}.get(night)
    if recorded is not None:
        return AimedNight(
            night=night,
            table=recorded.plan,
            budget=recorded.budget,
            unit=recorded.unit,
            select_dir=pool.dir,
            champion=recorded.champion,
            selection=recorded,
            notes=(f"Night {night} was selected on an earlier run: its rows are reused.",),
        )
    served = config.scaling.aim == "served"
    if served:
        champion, accept = "the live draft (served logs)", served_domain_accept(config)
    else:
        champion, accept = champion_accept(config, pool)
    states = domain_states(config, pool, accept)
    unit = config.scaling.budget_unit
    if budget is None:  # no --scale: everything left
        unit, budget = "prompts", max(sum(s.pool_left for s in states if not s.free), 1)
    floor, ceiling = config.scaling.floor, config.speculative.num_steps + 1
    if served:
        plan = allocate_headroom(states, budget, unit=unit, floor=floor, ceiling=ceiling)
    else:
        plan = allocate(
            states,
            budget,
            unit=unit,
            floor=floor,
            ceiling=ceiling,
            max_share=config.scaling.max_domain_share,
        )
    selection = (
        write_night(
            config,
            pool,
            night=night,
            rows=plan.rows(),
            budget=plan.budget,
            unit=plan.unit,
            plan=plan.table(),
            champion=champion,
        )
        if write
        else None
    )
    logger.info("night %d (aimed): %s", night, plan.rows())
    return AimedNight(
        night=night,
        table=plan.table(),
        budget=plan.budget,
        unit=plan.unit,
        select_dir=pool.dir,
        champion=champion,
        selection=selection,
        notes=plan.notes,
    )


def night_domains(
    config: PipelineConfig, select_dir: Path, draft_dir: Path
) -> dict[str, dict[str, float | None]]:
    """Tonight's per-domain point for the curve: rows and regenerated tokens selected so far, and
    the accept length of tonight's draft on each domain's eval prompts."""
    pool, nights = read_pool(select_dir), read_nights(select_dir)
    done, regen = taken(nights), _regen_stats(config, select_dir, nights)
    accept = domain_accept(config, Path(draft_dir), pool)
    return {
        d: {
            "rows": done.get(d, 0),
            "tokens": regen.get(d, [0, 0])[1],
            "accept": accept[d].accept_length if d in accept else None,
        }
        for d in sorted(pool.refs)
    }


def uniform_night(
    config: PipelineConfig, prompts_dir: Path, scale: int | None, shard_ids: list[int] | None = None
) -> Night:
    """Tonight under ``uniform`` (the original rule): the curve's last total + ``scale``, whole
    prompt shards; explicit ``shard_ids`` win (re-triggers, tests)."""
    manifest = Manifest.read(Path(prompts_dir))
    if manifest is None:
        raise FileNotFoundError(
            f"{prompts_dir} has no manifest: the normalize stage did not finish"
        )
    rows = shard_rows(manifest.files)
    plan = plan_night(
        rows, scale=scale, previous_total=previous_total(read_curve(config.root_path))
    )
    selected = plan.shard_ids if shard_ids is None else sorted(set(shard_ids))
    unknown = [k for k in selected if not 0 <= k < len(rows)]
    if unknown:
        raise ValueError(
            f"shard_ids {unknown} do not exist: the prompts stage has shards 0..{len(rows) - 1}"
        )
    new, total = (
        plan.new_shard_ids if shard_ids is None else selected,
        sum(rows[k] for k in selected),
    )
    exhausted = " - pool exhausted" if plan.exhausted else ""
    markdown = (
        f"## Tonight: uniform\n\nPrompt shards {selected} ({len(new)} new), {total:,} prompts of the "
        f"pool's {plan.pool_prompts:,}{exhausted}.\n"
    )
    return Night(
        policy="uniform",
        prompts_dir=str(prompts_dir),
        shard_ids=selected,
        total_prompts=total,
        new_shard_ids=new,
        pool_prompts=plan.pool_prompts,
        exhausted=plan.exhausted,
        plan_markdown=markdown,
    )


def explicit_night(config: PipelineConfig, prompts_dir: Path, shard_ids: list[int]) -> Night:
    """Under ``aimed``, explicit ``shard_ids`` name shards of the selection (a re-run of chosen
    shards): no new rows are selected."""
    select_dir = select_dir_for(config, Path(prompts_dir))
    nights = read_nights(select_dir)
    known = {i: n for n in nights for i in n.shards}
    unknown = sorted(set(shard_ids) - set(known))
    if unknown:
        have = f"0..{max(known)}" if known else "none yet (run a night first)"
        raise ValueError(
            f"shard_ids {unknown} do not exist: the aimed selection {select_dir} has shards {have}"
        )
    selected = sorted(set(shard_ids))
    rows = {e.path: e.rows for e in (Manifest.read(select_dir) or Manifest("select", "")).files}
    left = sum(pool_left(read_pool(select_dir), nights).values())
    return Night(
        policy="aimed",
        prompts_dir=str(select_dir),
        select_dir=str(select_dir),
        shard_ids=selected,
        total_prompts=sum(rows.get(shard_name(i), 0) for i in selected),
        new_shard_ids=selected,
        pool_prompts=left + sum(taken(nights).values()),
        exhausted=left == 0,
        plan_markdown=f"## Tonight: aimed, explicit shards {selected}\n\nNo new rows selected.\n",
    )


def plan_tonight(
    config: PipelineConfig,
    prompts_dir: Path,
    scale: int | None,
    shard_ids: list[int] | None = None,
    *,
    write: bool = True,
) -> Night:
    """Tonight's prompts by ``scaling.policy`` (``write`` False: plan only, select nothing): the
    regen input directory, its shard ids, the plan table and its Markdown (ending with how the draft
    will start: ``train.init``, the champion, the replay share)."""
    from eagle3.train.continual import planned_start_line

    if config.scaling.policy == "uniform":
        night = uniform_night(config, prompts_dir, scale, shard_ids)
    elif shard_ids is not None:
        night = explicit_night(config, prompts_dir, shard_ids)
    else:
        night = plan_aimed(config, Path(prompts_dir), scale, write=write).summary()
    return night.model_copy(
        update={"plan_markdown": night.plan_markdown + "\n" + planned_start_line(config) + "\n"}
    )
