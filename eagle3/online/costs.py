"""Stored vs online features: what a night costs each way, and the ``train.features=auto`` decision.

Per night of ``mix.total`` prompts at ``MEAN_TOKENS_PER_SAMPLE`` tokens (the disk estimate's assumption,
``eagle3.capture.budget``):

* **disk**: stored keeps every token's features (``bytes_per_token`` of ``capture.encoding``, uncompressed: an upper
  bound) plus the part files of the shards capturing at once; online keeps none (the regen shards, which both paths
  keep, are not counted).
* **capture GPU-hours per epoch**: tokens / ``train.online.prefill_tokens_per_s`` (an assumption: the prefill rate
  of one capture replica, set it from a measured prefill) x the GPUs one replica holds (``capture.gpus``). Stored
  captures once a night whatever ``train.epochs`` is; online captures every epoch again.
* **network per step**: the stored form of one global batch (``train.batch_size x train.nproc`` samples): what a
  trainer reads per step from shared storage when stored, or from the object store when online. The same bytes.

``auto`` picks stored when its disk fits the budget (``train.online.disk_budget_bytes``, else the free space at the
run root) and online when it does not: disk is the constraint stored training cannot work around, while online's
price (capture GPU-hours x epochs) is paid in time. The decision comes with its reason, for the log and the summary.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def night_costs(config: PipelineConfig, *, mean_tokens: int = MEAN_TOKENS_PER_SAMPLE) -> NightCosts | None:
    """The night's costs both ways; None when ``mix.total`` is unset (no night size to price)."""
    prompts = config.mix.total
    if prompts is None:
        return None
    capture, train = config.capture, config.train
    per_token = bytes_per_token(capture.encoding, capture.dtype, config.target.hidden_size, topk=capture.topk)
    tokens = prompts * mean_tokens
    shards = -(-prompts // config.normalize.shard_size)
    parts = shards_at_once(config, shards) * config.normalize.shard_size * mean_tokens * per_token
    gpus = capture.gpus if capture.device != "cpu" else 0
    hours = tokens / train.online.prefill_tokens_per_s / 3600 * max(gpus, 1)
    return NightCosts(tokens=tokens, stored_disk_bytes=tokens * per_token + parts,
                      capture_gpu_hours_per_epoch=hours, epochs=train.epochs,
                      bytes_per_step=train.batch_size * train.nproc * mean_tokens * per_token)


def cost_table(config: PipelineConfig) -> dict[str, Any]:
    """What ``eagle3 config show`` prints under ``features_stored_vs_online``."""
    costs = night_costs(config)
    if costs is None:
        return {"note": "mix.total is unset: no per-night estimate"}
    gpu = "CPU-hours" if config.capture.device == "cpu" else "GPU-hours"
    return {
        "assumed": f"{MEAN_TOKENS_PER_SAMPLE} tokens/sample, prefill {config.train.online.prefill_tokens_per_s:,.0f} "
                   f"tokens/s per capture replica of {config.capture.gpus} GPUs (train.online.prefill_tokens_per_s)",
        "stored": {"disk": human_bytes(costs.stored_disk_bytes),
                   f"capture_{gpu}": round(costs.stored_gpu_hours, 1) , "captures": "once a night"},
        "online": {"disk": human_bytes(0), f"capture_{gpu}_per_epoch": round(costs.capture_gpu_hours_per_epoch, 1),
                   f"capture_{gpu}": round(costs.online_gpu_hours, 1), "captures": f"every epoch ({costs.epochs})"},
        "network_per_step": f"{human_bytes(costs.bytes_per_step)} either way (stored: read from storage; online: "
                            "from the object store)",
    }  # fmt: skip


def disk_budget(config: PipelineConfig) -> int:
    """``train.online.disk_budget_bytes``, else the free space at the run root (its nearest existing parent)."""
    if config.train.online.disk_budget_bytes is not None:
        return config.train.online.disk_budget_bytes
    probe = Path(config.root_path)
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free


def choose_features(config: PipelineConfig, *, tokens: int | None = None) -> tuple[str, str]:
    """``(stored | online, why)`` for ``train.features`` (``auto`` decided by the disk budget; the others as set).
    ``tokens``: the night's real token count when its regen shards exist, else the estimate's."""
    mode = config.train.features
    if mode != "auto":
        return mode, f"train.features={mode}"
    capture = config.capture
    per_token = bytes_per_token(capture.encoding, capture.dtype, config.target.hidden_size, topk=capture.topk)
    costs = night_costs(config)
    need = tokens * per_token if tokens is not None else (costs.stored_disk_bytes if costs else 0)
    budget = disk_budget(config)
    hours = f"{costs.online_gpu_hours - costs.stored_gpu_hours:.1f} more capture GPU-hours" if costs else "re-capture"
    if need + capture.disk_reserve_bytes <= budget:
        return "stored", (f"train.features=auto -> stored: the features need {human_bytes(need)} (+ reserve "
                          f"{human_bytes(capture.disk_reserve_bytes)}) and {human_bytes(budget)} is available")
    return "online", (f"train.features=auto -> online: the features would need {human_bytes(need)} (+ reserve "
                      f"{human_bytes(capture.disk_reserve_bytes)}) but {human_bytes(budget)} is available; online "
                      f"writes none and costs {hours} over {config.train.epochs} epochs")
