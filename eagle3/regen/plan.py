"""The regen stage's plan: where its input and output live, its fingerprint, and its shards.

Stage fingerprint = hash(prompts fingerprint, sampling config, target model). The sampling config
includes what changes the text a thinking, tool-calling target writes or how it is kept:
``regen.thinking`` (the template's switch) and the reasoning and tool-call parsers, each only when
set, so a plain target's fingerprint is as before. The server URLs, concurrency,
retry and timeout settings are deliberately not in it: moving a 50-hour job to other servers must
resume it, not restart it. The plan is a frozen model: JSON on the wire (Prefect task parameters)
and ``plan.json`` on disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.config.regen import RegenConfig
from eagle3.data.dialect import reasoning_format
from eagle3.rundir.layout import CONFIG_FILE, PLAN_FILE, shard_index, shard_name, stage_dir
from eagle3.rundir.runroot import Manifest, atomic_write_text, fingerprint
from eagle3.stage import Plan


class RegenInputError(ValueError):
    """The prompts stage is missing or unfinished; the message says which command produces it."""


def sampling_fields(cfg: RegenConfig) -> dict[str, Any]:
    """The part of ``config.regen`` that changes what is generated (hence in the fingerprint)."""
    fields = {
        "api": cfg.api,
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "stop": list(cfg.stop),
        "keep_truncated": cfg.keep_truncated,
    }
    chat = {
        "reasoning_parser": cfg.reasoning_parser,
        "tool_call_parser": cfg.tool_call_parser,
        "chat_template_kwargs": template_kwargs(cfg),
        "max_turns": cfg.max_turns,
        "answers": cfg.answers if cfg.answers != "target" else None,
    }
    return fields | {k: v for k, v in chat.items() if v}


def template_kwargs(cfg: RegenConfig) -> dict[str, Any]:
    """``chat_template_kwargs`` for every rendering and OpenAI request: the thinking switch when
    set."""
    if cfg.thinking is None or cfg.reasoning_parser is None:
        return {}
    return {reasoning_format(cfg.reasoning_parser).toggle: cfg.thinking}


def target_fields(config: PipelineConfig) -> dict[str, Any]:
    return {"model_path": config.target.model_path, "revision": config.target.revision}


def regen_fingerprint(prompts_fp: str, config: PipelineConfig) -> str:
    return fingerprint("regen", prompts_fp, sampling_fields(config.regen), target_fields(config))


class RegenPlan(Plan):
    """One run of the regen stage; ``plan.json`` in the stage directory (read by ``eagle3 regen
    status`` from another terminal). The config it ran with is ``config.yaml`` beside it (``eagle3
    retry-shards`` reruns with it)."""

    prompts_dir: Path
    prompts_fingerprint: str
    shards: dict[int, int]  # every prompts shard index -> rows (``units`` are this run's)

    @property
    def total(self) -> int:
        return sum(self.shards[i] for i in self.units)

    def prompt_shard(self, index: int) -> Path:
        return self.prompts_dir / shard_name(index)


def _prompts_manifest(prompts_dir: Path) -> Manifest:
    manifest = Manifest.read(Path(prompts_dir))
    if manifest is None:
        raise RegenInputError(
            f"{prompts_dir} has no manifest.json: the prompts stage is not finished"
        )
    return manifest


def regen_dir_for(config: PipelineConfig, prompts_dir: Path) -> Path:
    """``<root>/regen/<fp>``: the regen stage of this config over a finished prompts stage."""
    fp = regen_fingerprint(_prompts_manifest(prompts_dir).fingerprint, config)
    return stage_dir(config.root_path, "regen", fp)


def plan_regen(
    config: PipelineConfig, prompts_dir: Path, shard_ids: Sequence[int] | None = None
) -> RegenPlan:
    """Plan the stage over a finished prompts stage: all its shards, or ``shard_ids`` (each must
    exist); writes ``plan.json`` and ``config.yaml`` into the stage directory."""
    prompts = Path(prompts_dir)
    manifest = _prompts_manifest(prompts)
    shards = {
        i: entry.rows for entry in manifest.files if (i := shard_index(entry.path)) is not None
    }
    if not shards:
        raise RegenInputError(f"{prompts}: the manifest lists no shard-NNNNN.parquet files")
    unknown = sorted(set(shard_ids or ()) - set(shards))
    if unknown:
        raise RegenInputError(
            f"shard ids {unknown} are not in this regen stage (it has {sorted(shards)})"
        )
    out = regen_dir_for(config, prompts)
    units = tuple(sorted(set(shard_ids))) if shard_ids is not None else tuple(sorted(shards))
    plan = RegenPlan(
        stage="regen",
        fingerprint=out.name,
        out_dir=out,
        units=units,
        prompts_dir=prompts,
        prompts_fingerprint=manifest.fingerprint,
        shards=shards,
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / CONFIG_FILE, config.to_yaml())
    atomic_write_text(out / PLAN_FILE, plan.model_dump_json(indent=2))
    return plan


def read_plan(regen_dir: Path) -> RegenPlan:
    """The plan a regen stage dir was last run with (``plan.json``)."""
    path = Path(regen_dir) / PLAN_FILE
    if not path.exists():
        raise RegenInputError(f"{regen_dir} has no {PLAN_FILE}: not a regen stage directory")
    return RegenPlan.model_validate_json(path.read_text())
