"""Read the frozen target ``embed_tokens`` and ``lm_head`` from its safetensors without loading the
whole model.

The draft needs two target tensors: the token embedding (its input) and the output head (to
recompute target logits from the stored ``last_hidden``). For a 1T-parameter target these are a few
GB inside hundreds of GB of shards, so we read ``model.safetensors.index.json`` (or a single
``model.safetensors``), find the shard holding each tensor and load only that tensor with
``safe_open``. Tied embeddings (no ``lm_head.weight`` stored, or ``tie_word_embeddings: true``)
reuse the embedding; a head missing from an untied checkpoint, or either tensor stored quantized, is
refused rather than read as something it is not. Hub ids download only the index and the needed
shards.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

logger = logging.getLogger(__name__)

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
EMBED_NAMES = (
    "model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
    "language_model.model.embed_tokens.weight",
)
HEAD_NAMES = (
    "lm_head.weight",
    "language_model.lm_head.weight",
    "model.language_model.lm_head.weight",
)
# What a quantized checkpoint stores next to (or instead of) a ``.weight``: compressed-tensors'
# packed ints, scales and zero points, DeepSeek-style block fp8's inverse scales. Read alone, such a
# weight is not the target's.
QUANTIZED_SUFFIXES = (
    "weight_packed",
    "weight_scale",
    "weight_zero_point",
    "weight_scale_inv",
    "weight_global_scale",
)


@dataclass
class TargetHead:
    """The frozen target tensors the draft trains against: ``embed [V, H]`` and ``lm_head [V,
    H]``."""

    embed: torch.Tensor
    lm_head: torch.Tensor
    tied: bool


def _locate(model_path: str, revision: str | None) -> tuple[Path, dict[str, str]]:
    """The directory holding the shards and a ``tensor name -> shard file`` map (names of the two we
    need)."""
    local = Path(model_path).expanduser()
    if local.is_dir():
        if (local / INDEX).exists():
            return local, json.loads((local / INDEX).read_text())["weight_map"]
        if (local / SINGLE).exists():
            with safe_open(str(local / SINGLE), framework="pt") as fh:
                return local, {name: SINGLE for name in fh.keys()}  # noqa: SIM118 - safe_open has no __iter__
        raise FileNotFoundError(
            f"{local} has neither {INDEX} nor {SINGLE}: point target.model_path at an HF checkpoint directory"
        )
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        index = Path(hf_hub_download(model_path, INDEX, revision=revision))
        return index.parent, json.loads(index.read_text())["weight_map"]
    except EntryNotFoundError as exc:
        logger.info("no %s for %s (%s); trying %s", INDEX, model_path, exc, SINGLE)
        single = Path(hf_hub_download(model_path, SINGLE, revision=revision))
        with safe_open(str(single), framework="pt") as fh:
            return single.parent, {name: SINGLE for name in fh.keys()}  # noqa: SIM118


def _read(base: Path, shard: str, name: str, model_path: str, revision: str | None) -> torch.Tensor:
    path = base / shard
    if not path.exists():
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(model_path, shard, revision=revision))
    with safe_open(str(path), framework="pt") as fh:
        return fh.get_tensor(name)


def load_target_head(
    model_path: str, *, revision: str | None = None, tie_word_embeddings: bool | None = None
) -> TargetHead:
    """Load only ``embed_tokens`` and ``lm_head`` of a target checkpoint (local dir or Hub id)."""
    base, weight_map = _locate(model_path, revision)
    quantized = [
        f"{name.removesuffix('.weight')}.{suffix}"
        for name in (*EMBED_NAMES, *HEAD_NAMES)
        for suffix in QUANTIZED_SUFFIXES
        if f"{name.removesuffix('.weight')}.{suffix}" in weight_map
    ]
    if quantized:
        raise ValueError(
            f"{model_path} stores the target's embedding or lm_head quantized ({', '.join(quantized)}); the draft "
            "trains against them in float: use a checkpoint that keeps both unquantized (compressed-tensors' "
            "`ignore`, as Kimi-K2.5's INT4 checkpoint does)"
        )
    embed_name = next((n for n in EMBED_NAMES if n in weight_map), None)
    if embed_name is None:
        raise KeyError(
            f"{model_path}: no embedding tensor among {EMBED_NAMES}; is this a causal LM checkpoint?"
        )
    embed = _read(base, weight_map[embed_name], embed_name, model_path, revision)
    head_name = next((n for n in HEAD_NAMES if n in weight_map), None)
    if head_name is None and tie_word_embeddings is False:
        raise KeyError(
            f"{model_path}: no lm_head tensor among {HEAD_NAMES}, and its config says "
            "tie_word_embeddings=false, so the embedding is not its head"
        )
    tied = bool(tie_word_embeddings) or head_name is None
    lm_head = embed if tied else _read(base, weight_map[head_name], head_name, model_path, revision)
    logger.info(
        "target head from %s: embed %s, lm_head %s (tied=%s)",
        model_path,
        tuple(embed.shape),
        tuple(lm_head.shape),
        tied,
    )
    return TargetHead(embed=embed, lm_head=lm_head, tied=tied)
