"""The regen stage's plan: where its input and output live, its fingerprint, and its shards.

Stage fingerprint = hash(prompts fingerprint, sampling config, target model). The server URLs, concurrency,
retry and timeout settings are deliberately not in it: moving a 50-hour job to other servers must resume it, not
restart it. The plan is a plain dict on the wire (Prefect task parameters) and ``plan.json`` on disk (read by
``eagle3 regen status`` from another terminal, and by ``eagle3 retry-shards`` to rerun with the same config).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from eagle3.config import PipelineConfig, RegenConfig
from eagle3.data.parquet import open_shard
from eagle3.layout import PLAN_FILE, shard_index, shard_name, stage_dir
from eagle3.runroot import Manifest, atomic_write_json, fingerprint


class RegenInputError(ValueError):
    """The prompts stage is missing or unfinished; the message says which command produces it."""


def sampling_fields(cfg: RegenConfig) -> dict[str, Any]:
    """The part of ``config.regen`` that changes what is generated (hence in the fingerprint)."""
    return {
        "api": cfg.api,
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "stop": list(cfg.stop),
        "keep_truncated": cfg.keep_truncated,
    }


def target_fields(config: PipelineConfig) -> dict[str, Any]:
    return {"model_path": config.target.model_path, "revision": config.target.revision}


def regen_fingerprint(prompts_fp: str, config: PipelineConfig) -> str:
    return fingerprint("regen", prompts_fp, sampling_fields(config.regen), target_fields(config))


@dataclass
class RegenPlan:
    fingerprint: str
    regen_dir: str
    prompts_dir: str
    prompts_fingerprint: str
    shards: dict[int, int]  # prompts shard index -> rows
    config: dict[str, Any]  # the PipelineConfig, JSON

    @property
    def pipeline(self) -> PipelineConfig:
        return _validated(json.dumps(self.config, sort_keys=True))

    @property
    def regen(self) -> RegenConfig:
        return self.pipeline.regen

    @property
    def total(self) -> int:
        return sum(self.shards.values())

    def prompt_shard(self, index: int) -> Path:
        return Path(self.prompts_dir) / shard_name(index)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"shards": {str(k): v for k, v in self.shards.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RegenPlan:
        return cls(**(data | {"shards": {int(k): int(v) for k, v in data["shards"].items()}}))

    def select(self, shard_ids: list[int] | None) -> list[int]:
        """The shards to run: all, or the given ids (each must exist)."""
        if shard_ids is None:
            return sorted(self.shards)
        unknown = sorted(set(shard_ids) - set(self.shards))
        if unknown:
            raise RegenInputError(f"shard ids {unknown} are not in this regen stage (it has {sorted(self.shards)})")
        return sorted(set(shard_ids))


@lru_cache(maxsize=8)
def _validated(config_json: str) -> PipelineConfig:
    return PipelineConfig.model_validate(json.loads(config_json))


def _prompts_manifest(prompts_dir: Path) -> Manifest:
    manifest = Manifest.read(Path(prompts_dir))
    if manifest is None:
        raise RegenInputError(f"{prompts_dir} has no manifest.json: the prompts stage is not finished")
    return manifest


def regen_dir_for(config: PipelineConfig, prompts_dir: Path) -> Path:
    """``<root>/regen/<fp>``: the regen stage of this config over a finished prompts stage."""
    fp = regen_fingerprint(_prompts_manifest(prompts_dir).fingerprint, config)
    return stage_dir(config.root_path, "regen", fp)


def plan_regen(config: PipelineConfig, prompts_dir: Path) -> RegenPlan:
    """Plan the stage over a finished prompts stage (fingerprint, shards); writes ``plan.json`` into its directory."""
    prompts = Path(prompts_dir)
    manifest = _prompts_manifest(prompts)
    out = regen_dir_for(config, prompts)
    shards = {}
    for entry in manifest.files:
        index = shard_index(entry.path)
        if index is not None:
            shards[index] = entry.rows
    if not shards:
        raise RegenInputError(f"{prompts}: the manifest lists no shard-NNNNN.parquet files")
    plan = RegenPlan(out.name, str(out), str(prompts), manifest.fingerprint, shards, config.model_dump(mode="json"))
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / PLAN_FILE, plan.to_dict())
    return plan


def shard_rows(path: Path) -> int:
    return int(open_shard(path).metadata.num_rows)


def read_plan(regen_dir: Path) -> RegenPlan:
    """The plan a regen stage dir was run with (``plan.json``)."""
    path = Path(regen_dir) / PLAN_FILE
    if not path.exists():
        raise RegenInputError(f"{regen_dir} has no {PLAN_FILE}: not a regen stage directory")
    return RegenPlan.from_dict(json.loads(path.read_text()))
