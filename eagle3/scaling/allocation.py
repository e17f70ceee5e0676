"""The aimed night's rule: split the night's regeneration budget across domains by expected gain.

Pure and deterministic: the same domain states, budget and config give the same plan (ties break by
domain name), and each domain's line says why it got what it got.

The model behind the rule. The serving-mix accept length is ``sum_d share_d * accept_d``. Each
domain's accept length is taken to grow with the log of the regenerated tokens it was trained on,
``accept_d ~ a_d + g_d ln(T_d + T0_d)`` (the EAGLE-3 paper's curve is straight on a log axis up to
8x), so the next token given to domain ``d`` is worth ``share_d * g_d / (T_d + x_d + T0_d)``: the
traffic share, times the gain per e-fold of data, divided by the data the domain already has
(diminishing returns). A prompt is worth that times the domain's tokens per row.

* ``g_d`` comes from the domain's own points (a least-squares slope of accept length on ln tokens
  over the nights that trained it), bounded by its headroom (``max accept - current accept``; chain
  speculation with k steps accepts at most k+1 per verify pass): a domain the draft already handles,
  or one where data stopped helping, gets little. Before a domain has two points its gain is not
  guessed from its headroom: a low accept length is as often a domain the draft cannot learn (a flat
  target distribution) as one it has not seen enough of, and headroom alone sent the first aimed
  nights' data to the unlearnable domain (``BENCHMARKS.md``, "Aimed vs uniform nights"). It takes
  the median of the measured domains' gains, still bounded by its headroom.
* While no domain has a measured gain, the rule has nothing to aim with, and the model's ``1 / T``
  term alone sends the night to the domains with the fewest tokens (short answers). Such a night is
  the uniform night instead: rows by traffic share (D'Hondt: the next row to the domain with the
  highest ``share / (rows + 1)``), whatever a row costs, as the uniform rule walks the pool. It also
  gives every domain a second point worth a slope.
* The exploration floor (``scaling.floor`` of the budget, split evenly over the domains with prompts
  left, and at least one row each while the budget allows: in a tokens budget a domain of long
  answers may cost more per row than its share) comes first, so a domain whose gain is mis-measured
  still gets data and a point of its own.
* The rest goes greedily, in small chunks, to the domain whose next chunk is worth the most per
  budget unit. The value is concave in ``x``, so greedy is the optimum of the model. Prompts budgets
  are spent exactly (or the pools run out); a tokens budget is spent until no domain's next row
  fits.
* Pre-tokenized rows need no regeneration: they are taken whole, outside the budget.
* Shrunk slopes and a domain cap. A fresh retrain moves a domain's accept length by about as much as
  a night's gain, so a slope over few nights is mostly noise. The planner estimates that noise
  itself: the pooled residual standard deviation of accept length around each domain's fit, over
  domains with three or more nights (``noise_estimate``; none before). Each slope is then shrunk by
  its standard error ``se = noise / sqrt(Sxx)``: ``slope x slope^2 / (slope^2 + se^2)`` (a slope
  within its noise counts for little). ``scaling.max_domain_share`` caps any domain's part of the
  budget (floor included). Each line says which rule bound it (``bound``: floor, pool, cap, gain,
  share).
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

# a night's budget is handed out in about this many chunks (finer than 0.5% of the budget)
CHUNKS = 256


@dataclass(frozen=True)
class DomainState:
    """What the rule knows about one domain tonight."""

    name: str
    pool_left: int  # rows not selected on an earlier night (eval rows never count)
    tokens_per_row: float  # estimated regenerated tokens per row
    share: float  # serving-traffic share (normalized over the pool's domains)
    # champion's accept length on the domain's eval prompts; None: not measured
    accept: float | None = None
    # (training tokens, accept length) of earlier nights
    points: tuple[tuple[float, float], ...] = ()
    trained_tokens: float = 0.0  # regenerated tokens of this domain trained on so far
    free: bool = False  # pre-tokenized rows: no regeneration


@dataclass(frozen=True)
class Allocation:
    """One domain's line of the plan."""

    domain: str
    rows: int
    cost: float  # budget units spent (prompts, or estimated regenerated tokens)
    pool_left: int
    share: float
    accept: float | None
    gain: float  # accept length per e-fold of the domain's tokens, as the rule used it
    why: str
    bound: str = "gain"  # the rule that bound this allocation: floor, pool, cap, gain, share, free


@dataclass(frozen=True)
class AimedPlan:
    budget: float
    unit: str  # "prompts" or "tokens"
    allocations: tuple[Allocation, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def spent(self) -> float:
        return sum(a.cost for a in self.allocations)

    def rows(self) -> dict[str, int]:
        return {a.domain: a.rows for a in self.allocations}

    def table(self) -> list[dict[str, object]]:
        return [
            {
                "domain": a.domain,
                "pool_left": a.pool_left,
                "current_accept": None if a.accept is None else round(a.accept, 3),
                "traffic_share": round(a.share, 3),
                "allocation": a.rows,
                "cost": round(a.cost, 1),
                "bound": a.bound,
                "why": a.why,
            }
            for a in self.allocations
        ]

    def markdown(self) -> str:
        return plan_markdown(self.table(), budget=self.budget, unit=self.unit, notes=self.notes)


def plan_markdown(
    table: Sequence[dict[str, object]], *, budget: float, unit: str, notes: Sequence[str] = ()
) -> str:
    """The plan table in Markdown (from ``AimedPlan.table`` rows, as the selection ledger records
    them)."""
    lines = [
        "| domain | pool left | current accept | traffic share | allocation | bound by | why |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for row in table:
        accept = "-" if row["current_accept"] is None else f"{row['current_accept']:.3f}"
        cost = "" if unit == "prompts" else f" (~{row['cost']:,.0f} tokens)"
        lines.append(
            f"| {row['domain']} | {row['pool_left']:,} | {accept} | {row['traffic_share']:.2f} | "
            f"{row['allocation']:,} rows{cost} | {row.get('bound', '-')} | {row['why']} |"
        )
    spent = sum(float(row["cost"]) for row in table)  # type: ignore[arg-type]
    head = f"Budget {budget:,.0f} {unit}, spent {spent:,.0f}."
    return "\n".join([head, "", *lines, *(f"\n{n}" for n in notes)]) + "\n"


def headroom(state: DomainState, ceiling: float) -> float | None:
    return None if state.accept is None else max(ceiling - state.accept, 0.0)


def _fit(points: Sequence[tuple[float, float]]) -> tuple[float, float, float, int] | None:
    """Least squares of accept length on ln tokens: (slope, Sxx, residual sum of squares, points);
    None: < 2 x."""
    usable = [(math.log(t), a) for t, a in points if t > 0]
    if len({x for x, _ in usable}) < 2:
        return None
    mean_x, mean_y = statistics.fmean(x for x, _ in usable), statistics.fmean(y for _, y in usable)
    sxx = sum((x - mean_x) ** 2 for x, _ in usable)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in usable) / sxx
    ssr = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in usable)
    return slope, sxx, ssr, len(usable)


def noise_estimate(domains: Sequence[DomainState]) -> tuple[float, int] | None:
    """The planner's noise: pooled residual standard deviation of accept length around the domains'
    fits, and its degrees of freedom (domains with three or more nights); None before any has
    three."""
    ssr, dof = 0.0, 0
    for d in domains:
        fit = _fit(d.points)
        if fit is not None and fit[3] >= 3:
            ssr, dof = ssr + fit[2], dof + fit[3] - 2
    return (math.sqrt(ssr / dof), dof) if dof else None


def domain_gain(
    state: DomainState, *, ceiling: float, noise: float | None = None
) -> tuple[float | None, str]:
    """Accept length per e-fold of tokens from the domain's own points (None: fewer than two), and
    its source; with a ``noise`` estimate, shrunk by the slope's standard error (module
    docstring)."""
    fit = _fit(state.points)
    if fit is None:
        return None, ""
    slope, sxx, _, n = fit
    source = f"measured {slope:+.3f}/e-fold over {n} nights"
    if noise:
        se = noise / math.sqrt(sxx)
        slope = slope * slope**2 / (slope**2 + se**2) if slope else 0.0
        source += f" +-{se:.3f}, shrunk to {slope:+.3f}"
    room = headroom(state, ceiling)
    return max(0.0, slope if room is None else min(slope, room)), source


def _gains(
    domains: Sequence[DomainState], *, ceiling: float, noise: float | None
) -> dict[str, tuple[float, str]]:
    found = {d.name: domain_gain(d, ceiling=ceiling, noise=noise) for d in domains}
    measured = [g for g, _ in found.values() if g is not None]
    fill = statistics.median(measured) if measured else 1.0
    why = (
        "not measured: median gain of the measured"
        if measured
        else "nothing measured yet: rows by traffic share"
    )
    out = {}
    for d in domains:
        gain, source = found[d.name]
        room = headroom(d, ceiling)
        if gain is None and room is not None and room < fill:
            gain, source = room, f"{why}, bounded by headroom {room:.2f}"
        out[d.name] = (fill, why) if gain is None else (gain, source)
    return out


def _cost(state: DomainState, unit: str) -> float:
    return 1.0 if unit == "prompts" else max(state.tokens_per_row, 1.0)


def _value(state: DomainState, gain: float | None, rows: int, unit: str) -> float:
    """Expected serving-mix gain per budget unit of the next row, ``rows`` rows into tonight's
    allocation; with no gain measured anywhere (``None``), the uniform night's priority by traffic
    share."""
    if gain is None:
        return state.share / (rows + 1)
    tokens = state.trained_tokens + rows * state.tokens_per_row + max(state.tokens_per_row, 1.0)
    return state.share * gain * state.tokens_per_row / tokens / _cost(state, unit)


def allocate(
    domains: Sequence[DomainState],
    budget: float,
    *,
    unit: str,
    floor: float,
    ceiling: float,
    max_share: float = 1.0,
) -> AimedPlan:
    """Tonight's rows per domain (see the module docstring); ``budget`` in ``unit`` (prompts or
    tokens); no domain gets more than ``max_share`` of the budget."""
    if budget <= 0:
        raise ValueError(f"budget={budget}: give the night a positive budget (--scale)")
    ordered = sorted(domains, key=lambda d: d.name)
    live = [d for d in ordered if d.pool_left > 0 and not d.free]
    noise = noise_estimate(live)
    gains = _gains(live, ceiling=ceiling, noise=noise[0] if noise else None)
    caps = {d.name: min(d.pool_left, int(max_share * budget / _cost(d, unit))) for d in live}
    rows = {d.name: 0 for d in ordered}
    floor_rows, left = {}, budget
    # at least one row each while the budget allows: a share below one row's cost is still a point
    for d in live:
        share_rows = max(1 if floor > 0 else 0, int(floor * budget / len(live) / _cost(d, unit)))
        floor_rows[d.name] = rows[d.name] = min(
            caps[d.name], share_rows, int(left // _cost(d, unit))
        )
        left -= rows[d.name] * _cost(d, unit)
    aim = any(not source.startswith("nothing measured") for _, source in gains.values())
    left = _greedy(live, gains if aim else dict.fromkeys(gains), rows, left, budget, unit, caps)
    allocations = []
    for d in ordered:
        gain, source = gains.get(d.name, (0.0, ""))
        bound = _bound(d, rows[d.name], floor_rows.get(d.name, 0), caps.get(d.name, 0), aim)
        why = _why(d, rows[d.name], floor_rows.get(d.name, 0), gain, source, budget, unit)
        why += f" (capped: scaling.max_domain_share={max_share:g})" if bound == "cap" else ""
        taken = d.pool_left if d.free else rows[d.name]
        cost = 0.0 if d.free else taken * _cost(d, unit)
        allocations.append(
            Allocation(d.name, taken, cost, d.pool_left, d.share, d.accept, gain, why, bound)
        )
    ran_out = all(rows[d.name] == d.pool_left for d in live) and left > 0
    notes = (
        (f"Every domain's pool ran out: {left:,.0f} {unit} of the budget unspent.",)
        if ran_out
        else ()
    )
    capped = [a.domain for a in allocations if a.bound == "cap"]
    if capped and not ran_out and left >= min(_cost(d, unit) for d in live):
        notes += (
            f"{left:,.0f} {unit} of the budget unspent: {', '.join(capped)} at scaling.max_domain_share, "
            "no other domain's next row fits or has rows left.",
        )
    notes += (_noise_note(noise),) if aim else ()
    return AimedPlan(budget=budget, unit=unit, allocations=tuple(allocations), notes=notes)


def _noise_note(noise: tuple[float, int] | None) -> str:
    if noise is None:
        return "No noise estimate yet (a domain needs three nights): slopes are used as measured."
    return (
        f"Planner noise: accept length scatters +-{noise[0]:.3f} around the domains' fits ({noise[1]} degrees of "
        "freedom); each slope is shrunk by its standard error."
    )


def _bound(d: DomainState, rows: int, floor_rows: int, cap: int, aim: bool) -> str:
    """Which rule set this domain's rows: free, pool, cap, floor, gain (or share, when nothing is
    measured)."""
    if d.free:
        return "free"
    if d.pool_left == 0 or rows == d.pool_left:
        return "pool"
    if rows >= cap:
        return "cap"
    if rows <= floor_rows:
        return "floor"
    return "gain" if aim else "share"


def _greedy(
    live: Sequence[DomainState],
    gains: dict[str, tuple[float, str] | None],
    rows: dict[str, int],
    left: float,
    budget: float,
    unit: str,
    caps: dict[str, int],
) -> float:
    """Hand out ``left`` budget units in chunks to the domain whose next row is worth most; returns
    what is left. A ``None`` gain: nothing is measured, rows go by traffic share one at a time."""
    by_name = {d.name: d for d in live}
    gain = {name: None if g is None else g[0] for name, g in gains.items()}
    heap = [
        (-_value(d, gain[d.name], rows[d.name], unit), d.name)
        for d in live
        if rows[d.name] < caps[d.name]
    ]
    heapq.heapify(heap)
    while heap:
        _, name = heapq.heappop(heap)
        d = by_name[name]
        cost = _cost(d, unit)
        affordable = min(caps[name] - rows[name], int(left // cost))
        if affordable <= 0:
            continue  # this domain's next row does not fit; a cheaper domain's may
        take = 1 if gain[name] is None else min(affordable, max(1, int(budget / cost / CHUNKS)))
        rows[name] += take
        left -= take * cost
        if rows[name] < caps[name]:
            heapq.heappush(heap, (-_value(d, gain[name], rows[name], unit), name))
    return left


def _why(
    d: DomainState, rows: int, floor_rows: int, gain: float, source: str, budget: float, unit: str
) -> str:
    if d.free and d.pool_left:
        return "pre-tokenized: no regeneration, taken whole outside the budget"
    if d.pool_left == 0:
        return "pool empty: every row is selected already or held out for eval"
    percent = 100 * rows * _cost(d, unit) / budget
    if source.startswith("nothing measured"):
        reason = f"{source} {d.share:.2f}"
    else:
        reason = f"gain {gain:.3f}/e-fold ({source}) x share {d.share:.2f}"
    if rows == d.pool_left:
        return f"{reason}: whole pool left ({percent:.0f}% of the budget)"
    if rows <= floor_rows:
        return f"{reason}: floor only ({percent:.0f}% of the budget)"
    return f"{reason}: {percent:.0f}% of the budget"
