"""The aimed nights' selection (``scaling.policy: aimed``): the pool by domain with a fixed eval set
held out, and the rows each night takes, written as prompt shards that regen reads like a prompts
stage.

``<root>/selection/<fp>/`` (fp: the prompts stage's fingerprint and how domains and the eval set are
drawn)::

    pool.json            every prompt row by domain, as (prompt shard, row) in the pool's order, eval rows left out;
                         the pre-tokenized rows; the eval ids. Written once, last (its presence marks it done).
    eval.parquet         the held-out eval rows (PROMPT_SCHEMA): never selected, hence never regenerated or
                         trained on (checked by sample id), the same rows every night
    nights.json          the ledger: per night, its budget, the rows per domain, its shards and the plan it showed
    shard-NNNNN.parquet  a night's rows, one domain per shard (never rewritten: regen and capture reuse them by id)
    manifest.json        the shards so far (rewritten as nights add shards): what regen reads

Design choices:

* A domain is the row's ``source`` or a field of its ``meta`` (``scaling.domain_key``). A night
  takes each domain's next rows in the pool's order, so "which rows are left" is a count per domain,
  and a night recorded in the ledger is reused as is when it runs again (a crashed night resumes
  instead of selecting twice).
* The eval set is the first ``scaling.eval_per_domain`` rows of each domain in an order of seeded
  sample-id hashes (at most a quarter of the domain; rows without messages to prompt with, the
  pre-tokenized ones, never): fixed for a prompts stage, different for another seed. Sample ids are
  content hashes, and normalize dedups them across sources, so keeping the eval ids out of the pool
  keeps every copy of those prompts out of training.
* Pre-tokenized rows need no regeneration: the first night takes them whole, outside its budget
(``eagle3.scaling.allocation``).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from eagle3.config.pipeline import PipelineConfig
from eagle3.data.parquet import ShardWriter, open_shard, write_table
from eagle3.data.schema import PROMPT_SCHEMA
from eagle3.rundir.layout import shard_index, shard_name, stage_dir
from eagle3.rundir.runroot import FileEntry, Manifest, atomic_write_json, fingerprint

SELECT_VERSION = "1"
POOL_FILE = "pool.json"
EVAL_FILE = "eval.parquet"
NIGHTS_FILE = "nights.json"
FREE = "(pre-tokenized)"  # the plan's line for the rows that need no regeneration
UNKNOWN = "unknown"  # the domain of a row whose meta lacks scaling.domain_key
EVAL_FRACTION = 4  # the eval set takes at most 1/4 of a domain's rows

Ref = tuple[int, int]  # (prompt shard, row in it)


class SelectionError(ValueError):
    """The selection cannot be built or extended; the message says how to fix it."""


def domain_of(source: str | None, meta: str | None, key: str) -> str:
    """A row's domain: its ``source``, or the ``meta.<field>`` that ``key`` names (``unknown`` when
    absent)."""
    if key == "source":
        return source or UNKNOWN
    value = json.loads(meta or "{}").get(key.removeprefix("meta."))
    return str(value) if isinstance(value, (str, int, float)) and str(value) else UNKNOWN


def select_fingerprint(config: PipelineConfig, prompts_fp: str) -> str:
    s = config.scaling
    return fingerprint(
        "select", SELECT_VERSION, prompts_fp, s.domain_key, s.eval_per_domain, s.eval_seed
    )


def select_dir_for(config: PipelineConfig, prompts_dir: Path) -> Path:
    """``<root>/selection/<fp>``: the selection this config draws from a finished prompts stage."""
    manifest = Manifest.read(Path(prompts_dir))
    if manifest is None:
        raise SelectionError(f"{prompts_dir} has no manifest.json: run `eagle3 normalize` first")
    return stage_dir(config.root_path, "select", select_fingerprint(config, manifest.fingerprint))


@dataclass(frozen=True)
class DomainPool:
    """Every selectable row by domain (eval rows left out), the pre-tokenized rows and the eval
    ids."""

    dir: Path
    prompts_dir: Path
    refs: dict[str, list[Ref]]
    free: list[Ref]
    eval_ids: frozenset[str]
    eval_domains: dict[str, int] = field(default_factory=dict)  # domain -> eval prompts

    @property
    def eval_path(self) -> Path:
        return self.dir / EVAL_FILE


@dataclass(frozen=True)
class NightSelection:
    """One aimed night in the ledger."""

    night: int
    budget: float
    unit: str
    rows: dict[str, int]  # domain (or FREE) -> rows taken tonight
    shards: dict[int, str]  # selection shard -> its domain
    plan: list[dict[str, Any]] = field(default_factory=list)  # the plan table the night showed
    champion: str | None = None  # the draft whose per-domain accept lengths the plan used

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NightSelection:
        return cls(**(data | {"shards": {int(k): v for k, v in data["shards"].items()}}))


def _prompt_shards(prompts_dir: Path) -> dict[int, Path]:
    manifest = Manifest.read(prompts_dir)
    if manifest is None:
        raise SelectionError(f"{prompts_dir} has no manifest.json: run `eagle3 normalize` first")
    return {
        i: prompts_dir / e.path for e in manifest.files if (i := shard_index(e.path)) is not None
    }


def _scan(prompts_dir: Path, key: str) -> list[tuple[Ref, str, str, bool]]:
    """(ref, sample id, domain, pre-tokenized) of every prompt row, in the pool's order."""
    rows = []
    for index, path in sorted(_prompt_shards(prompts_dir).items()):
        table = open_shard(path, schema=PROMPT_SCHEMA).read(
            columns=["sample_id", "source", "meta", "input_ids"]
        )
        data = table.to_pydict()
        for r, (sid, source, meta, ids) in enumerate(zip(*data.values(), strict=True)):
            rows.append(((index, r), sid, domain_of(source, meta, key), ids is not None))
    return rows


def _held_out(
    rows: list[tuple[Ref, str, str, bool]], per_domain: int, seed: int
) -> dict[str, list[Ref]]:
    """The eval rows of each domain: the first of its promptable rows in the seeded hash order."""
    by_domain: dict[str, list[tuple[str, Ref]]] = defaultdict(list)
    for ref, sid, domain, free in rows:
        if not free:
            by_domain[domain].append((hashlib.sha256(f"{seed}:{sid}".encode()).hexdigest(), ref))
    return {
        d: [ref for _, ref in sorted(c)[: min(per_domain, len(c) // EVAL_FRACTION)]]
        for d, c in by_domain.items()
    }


def build_pool(config: PipelineConfig, prompts_dir: Path) -> DomainPool:
    """The domain pool of a finished prompts stage (built once: ``pool.json`` written last, then
    read back)."""
    prompts_dir = Path(prompts_dir)
    out = select_dir_for(config, prompts_dir)
    if not (out / POOL_FILE).exists():
        rows = _scan(prompts_dir, config.scaling.domain_key)
        held = _held_out(rows, config.scaling.eval_per_domain, config.scaling.eval_seed)
        held_refs = {ref for refs in held.values() for ref in refs}
        refs: dict[str, list[Ref]] = defaultdict(list)
        for ref, _sid, domain, free in rows:
            if not free and ref not in held_refs:
                refs[domain].append(ref)
        eval_table = _take(prompts_dir, sorted(held_refs))
        out.mkdir(parents=True, exist_ok=True)
        write_table(out / EVAL_FILE, eval_table)
        atomic_write_json(
            out / POOL_FILE,
            {
                "prompts_dir": str(prompts_dir),
                "domains": dict(sorted(refs.items())),
                "free": [ref for ref, _sid, _d, free in rows if free],
                "eval_ids": sorted(eval_table["sample_id"].to_pylist()),
                "eval_domains": {d: len(r) for d, r in sorted(held.items()) if r},
            },
        )
    return read_pool(out)


def read_pool(select_dir: Path) -> DomainPool:
    data = json.loads((Path(select_dir) / POOL_FILE).read_text())
    return DomainPool(
        dir=Path(select_dir),
        prompts_dir=Path(data["prompts_dir"]),
        refs={d: [tuple(r) for r in refs] for d, refs in data["domains"].items()},
        free=[tuple(r) for r in data["free"]],
        eval_ids=frozenset(data["eval_ids"]),
        eval_domains=data["eval_domains"],
    )


def _take(prompts_dir: Path, refs: list[Ref]) -> pa.Table:
    """The prompt rows at ``refs``, in that order (PROMPT_SCHEMA)."""
    if not refs:
        return PROMPT_SCHEMA.empty_table()
    shards, wanted = _prompt_shards(prompts_dir), sorted(set(refs))
    by_shard: dict[int, list[int]] = defaultdict(list)
    for index, row in wanted:
        by_shard[index].append(row)
    parts = [
        open_shard(shards[i], schema=PROMPT_SCHEMA).read(columns=PROMPT_SCHEMA.names).take(rows)
        for i, rows in sorted(by_shard.items())
    ]
    at = {ref: n for n, ref in enumerate(wanted)}  # the parts hold ``wanted`` in order
    return pa.concat_tables(parts).take([at[ref] for ref in refs]).cast(PROMPT_SCHEMA)


def read_nights(select_dir: Path) -> list[NightSelection]:
    path = Path(select_dir) / NIGHTS_FILE
    return (
        [NightSelection.from_dict(n) for n in json.loads(path.read_text())] if path.exists() else []
    )


def taken(nights: list[NightSelection]) -> dict[str, int]:
    """Rows selected so far, per domain (and FREE)."""
    out: dict[str, int] = defaultdict(int)
    for night in nights:
        for domain, n in night.rows.items():
            out[domain] += n
    return dict(out)


def pool_left(pool: DomainPool, nights: list[NightSelection]) -> dict[str, int]:
    """Rows not selected yet, per domain (FREE: the pre-tokenized rows)."""
    done = taken(nights)
    left = {d: len(refs) - done.get(d, 0) for d, refs in pool.refs.items()}
    return left | ({FREE: len(pool.free) - done.get(FREE, 0)} if pool.free else {})


def write_night(
    config: PipelineConfig,
    pool: DomainPool,
    *,
    night: int,
    rows: dict[str, int],
    budget: float,
    unit: str,
    plan: list[dict[str, Any]],
    champion: str | None = None,
) -> NightSelection:
    """Tonight's rows as new shards, then the ledger, then the manifest; a night already in the
    ledger is returned as recorded (the same rows: a night run again resumes)."""
    nights = read_nights(pool.dir)
    recorded = {n.night: n for n in nights}
    if night in recorded:
        return recorded[night]
    if nights and night < nights[-1].night:
        raise SelectionError(
            f"night {night} comes before the ledger's last night {nights[-1].night} "
            f"({pool.dir / NIGHTS_FILE}): the scaling curve lost points; restore it"
        )
    left, done = pool_left(pool, nights), taken(nights)
    over = {d: n for d, n in rows.items() if n > left.get(d, 0)}
    if over:
        raise SelectionError(
            f"night {night} asks for more rows than are left: {over} (left {left})"
        )
    start = max((i for n in nights for i in n.shards), default=-1) + 1
    shards: dict[int, str] = {}
    entries: list[FileEntry] = []
    for domain, n in sorted(rows.items()):
        if n <= 0:
            continue
        source = pool.free if domain == FREE else pool.refs[domain]
        chunk = source[done.get(domain, 0) : done.get(domain, 0) + n]
        with ShardWriter(
            pool.dir,
            PROMPT_SCHEMA,
            start_index=start,
            rows_per_shard=config.normalize.shard_size,
            metadata={"stage": "select", "domain": domain, "night": str(night)},
        ) as writer:
            writer.write_table(_take(pool.prompts_dir, chunk))
            infos = writer.close()
        for info in infos:
            shards[start] = domain
            entries.append(
                FileEntry.of(
                    info.path,
                    rows=info.rows,
                    base=pool.dir,
                    sha256=info.sha256,
                    footer_sha256=info.footer_sha256,
                )
            )
            start += 1
    selection = NightSelection(
        night=night,
        budget=budget,
        unit=unit,
        rows={d: n for d, n in rows.items() if n > 0},
        shards=shards,
        plan=plan,
        champion=champion,
    )
    atomic_write_json(pool.dir / NIGHTS_FILE, [asdict(n) for n in [*nights, selection]])
    _write_manifest(config, pool.dir, [*nights, selection], entries)
    return selection


def _write_manifest(
    config: PipelineConfig, select_dir: Path, nights: list[NightSelection], new: list[FileEntry]
) -> None:
    """Every night's shards: earlier entries from the previous manifest (hashed only when it lacks
    one), then tonight's from their writer."""
    known = {e.path: e for e in (Manifest.read(select_dir) or Manifest("select", "")).files} | {
        e.path: e for e in new
    }
    files = []
    for index in sorted(i for n in nights for i in n.shards):
        path = select_dir / shard_name(index)
        files.append(
            known.get(path.name)
            or FileEntry.of(path, rows=open_shard(path).metadata.num_rows, base=select_dir)
        )
    Manifest(
        "select",
        select_dir.name,
        files=files,
        config={"scaling": config.scaling.model_dump(mode="json")},
        stats={"nights": len(nights), "rows": taken(nights)},
    ).write(select_dir)
