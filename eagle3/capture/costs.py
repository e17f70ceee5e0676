"""Stored vs online features: what a night costs each way, and the ``train.features=auto`` decision.

Per night of ``mix.total`` prompts at ``MEAN_TOKENS_PER_SAMPLE`` tokens (the disk estimate's
assumption,
``eagle3.capture.budget``):

* **disk**: stored keeps every token's features (``bytes_per_token`` of ``capture.encoding``,
  uncompressed: an upper bound) plus the part files of the shards capturing at once; online keeps
  none (the regen shards, which both paths keep, are not counted).
* **capture GPU-hours per epoch**: tokens / ``train.online.prefill_tokens_per_s`` (an assumption:
  the prefill rate of one capture replica, set it from a measured prefill) x the GPUs one replica
  holds (``capture.gpus``). Stored captures once a night whatever ``train.epochs`` is; online
  captures every epoch again.
* **network per step**: the stored form of one global batch (``train.batch_size x train.nproc``
  samples): what a trainer reads per step from shared storage when stored, or from the object store
  when online. The same bytes.

``auto`` picks stored when its disk fits the budget (``train.online.disk_budget_bytes``, else the
free space at the run root) and online when it does not: disk is the constraint stored training
cannot work around, while online's price (capture GPU-hours x epochs) is paid in time. The decision
comes with its reason, for the log and the summary.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from eagle3.capture.budget import MEAN_TOKENS_PER_SAMPLE, human_bytes, shards_at_once
from eagle3.capture.encoding import bytes_per_token
from eagle3.config.pipeline import PipelineConfig


@dataclass(frozen=True)
class NightCosts:
    tokens: int
    stored_disk_bytes: int
    capture_gpu_hours_per_epoch: float
    epochs: int
    bytes_per_step: int

    @property
    def stored_gpu_hours(self) -> float:
        return self.capture_gpu_hours_per_epoch

    @property
    def online_gpu_hours(self) -> float:
        return self.capture_gpu_hours_per_epoch * self.epochs


def night_costs(
    config: PipelineConfig, *, mean_tokens: int = MEAN_TOKENS_PER_SAMPLE
) -> NightCosts | None:
    """The night's costs both ways; None when ``mix.total`` is unset (no night size to price)."""
    prompts = config.mix.total
    if prompts is None:
        return None
    capture, train = config.capture, config.train
    per_token = bytes_per_token(
        capture.encoding, capture.dtype, config.target.hidden_size, topk=capture.topk
    )
    tokens = prompts * mean_tokens
    shards = -(-prompts // config.normalize.shard_size)
    parts = shards_at_once(config, shards) * config.normalize.shard_size * mean_tokens * per_token
    hours = capture_gpu_hours(config, tokens)
    return NightCosts(
        tokens=tokens,
        stored_disk_bytes=tokens * per_token + parts,
        capture_gpu_hours_per_epoch=hours,
        epochs=train.epochs,
        bytes_per_step=train.batch_size * train.nproc * mean_tokens * per_token,
    )


def capture_gpu_hours(config: PipelineConfig, tokens: int) -> float:
    """GPU-hours (CPU-hours on CPU) one capture pass over ``tokens`` takes at the assumed prefill
    rate."""
    gpus = config.capture.gpus if config.capture.device != "cpu" else 0
    return tokens / config.train.online.prefill_tokens_per_s / 3600 * max(gpus, 1)


def cost_table(config: PipelineConfig) -> dict[str, Any]:
    """What ``eagle3 config show`` prints under ``features_stored_vs_online``."""
    costs = night_costs(config)
    if costs is None:
        return {"note": "mix.total is unset: no per-night estimate"}
    gpu = "CPU-hours" if config.capture.device == "cpu" else "GPU-hours"
    wall = costs.capture_gpu_hours_per_epoch / max(
        config.capture.gpus if config.capture.device != "cpu" else 1, 1
    )
    return {
        "assumed": f"{MEAN_TOKENS_PER_SAMPLE} tokens/sample, prefill {config.train.online.prefill_tokens_per_s:,.0f} "
        f"tokens/s per capture replica of {config.capture.gpus} GPUs (train.online.prefill_tokens_per_s)",
        "stored": {
            "disk": human_bytes(costs.stored_disk_bytes),
            f"capture_{gpu}": round(costs.stored_gpu_hours, 1),
            "captures": "once a night",
        },
        "online": {
            "disk": human_bytes(0),
            f"capture_{gpu}_per_epoch": round(costs.capture_gpu_hours_per_epoch, 1),
            f"capture_{gpu}": round(costs.online_gpu_hours, 1),
            "captures": f"every epoch ({costs.epochs})",
            "recapture_per_extra_epoch": f"{costs.capture_gpu_hours_per_epoch:.1f} {gpu} "
            f"({wall:.1f} h of one {config.capture.gpus}-GPU replica): no spool, every epoch captures again",
        },
        "stored_wins": f"whenever {human_bytes(costs.stored_disk_bytes)} fits the disk: it captures once, online "
        f"pays the capture again for each epoch after the first (auto picks online only when the "
        f"features do not fit)",
        "network_per_step": f"{human_bytes(costs.bytes_per_step)} either way (stored: read from storage; online: "
        "from the object store)",
    }


def disk_budget(config: PipelineConfig) -> int:
    """``train.online.disk_budget_bytes``, else the free space at the run root (its nearest existing
    parent)."""
    if config.train.online.disk_budget_bytes is not None:
        return config.train.online.disk_budget_bytes
    probe = Path(config.root_path)
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


class FeaturesChoice(NamedTuple):
    """``train.features`` decided: ``stored`` or ``online``, and why (the one log line, the night's
    summary)."""

    mode: str
    why: str


@dataclass(frozen=True)
class RegenTokens:
    """The tokens the stored path would still capture, counted in the regen shards' footers."""

    tokens: int
    shards: int  # regen shards counted
    captured: int  # regen shards whose feature shard already exists (their disk is already spent)

    def describe(self) -> str:
        done = f", {self.captured} already captured" if self.captured else ""
        return f"counted: {self.tokens:,} tokens in {self.shards} regen shards{done}"


def regen_tokens(config: PipelineConfig, regen_dir: Path | None) -> RegenTokens | None:
    """Tokens of the ready regen shards in ``regen_dir`` (the set an online plan trains on) whose
    feature shard this config's features stage does not hold yet; None when there are none to count
    (regen has not run).

    Read from each shard's Parquet footer (the ``input_ids`` leaf's value count per row group), not
    its pages: free at any night size. An upper bound of what capture keeps: rows capture
    quarantines or truncates to ``capture.max_seq_len`` are counted whole."""
    import pyarrow.parquet as pq

    from eagle3.capture.shard import features_fingerprint, regen_shards
    from eagle3.rundir.layout import shard_index, shard_name, stage_dir

    shards = (
        regen_shards(Path(regen_dir)) if regen_dir is not None and Path(regen_dir).is_dir() else []
    )
    if not shards:
        return None
    features = stage_dir(
        config.root_path, "capture", features_fingerprint(config, Path(regen_dir).name)
    )
    tokens, captured = 0, 0
    for shard in shards:
        if (features / shard_name(shard_index(shard))).exists():
            captured += 1
            continue
        meta = pq.ParquetFile(shard).metadata
        tokens += sum(
            meta.row_group(g).column(c).num_values
            for g in range(meta.num_row_groups)
            for c in range(meta.num_columns)
            if meta.row_group(g).column(c).path_in_schema.split(".")[0] == "input_ids"
        )
    return RegenTokens(tokens=tokens, shards=len(shards), captured=captured)


def choose_features(config: PipelineConfig, *, regen_dir: Path | None = None) -> FeaturesChoice:
    """``(stored | online, why)`` for ``train.features`` (``auto`` decided by the disk budget; the
    others as set). The stored path's disk is counted from the regen shards in ``regen_dir`` when
    they exist (``regen_tokens``), else estimated from ``mix.total`` (before regen has run); ``why``
    says which."""
    mode = config.train.features
    if mode != "auto":
        return FeaturesChoice(mode, f"train.features={mode}")
    capture = config.capture
    per_token = bytes_per_token(
        capture.encoding, capture.dtype, config.target.hidden_size, topk=capture.topk
    )
    costs = night_costs(config)
    counted = regen_tokens(config, regen_dir)
    if counted is not None:
        need, basis = counted.tokens * per_token, counted.describe()
    else:
        need = costs.stored_disk_bytes if costs else 0
        basis = (
            f"estimated: mix.total x {MEAN_TOKENS_PER_SAMPLE} tokens/sample, no regen shards yet"
            if costs
            else "no regen shards and mix.total unset: nothing to store"
        )
    budget = disk_budget(config)
    needs = f"{human_bytes(need)} ({basis}; + reserve {human_bytes(capture.disk_reserve_bytes)})"
    if need + capture.disk_reserve_bytes <= budget:
        return FeaturesChoice(
            "stored",
            f"train.features=auto -> stored: the features need {needs} and "
            f"{human_bytes(budget)} is available",
        )
    tokens = counted.tokens if counted is not None else (costs.tokens if costs else 0)
    hours = f"{capture_gpu_hours(config, tokens) * (config.train.epochs - 1):.1f} more capture GPU-hours"
    return FeaturesChoice(
        "online",
        f"train.features=auto -> online: the features would need {needs} but "
        f"{human_bytes(budget)} is available; online writes none and costs {hours} over "
        f"{config.train.epochs} epochs",
    )
