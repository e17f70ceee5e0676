"""The draft's identity: the fingerprint naming its directory, and what defines a run besides data.

* ``draft_fingerprint``: the features and the vocab it trains on, the ``train`` fields that change
  what is trained, the target and, for a night built on the champion, its start. Which ``train``
  fields those are is said where each field is declared (``eagle3.config.train.DraftKey``), so a new
  field states its role once, beside its default.
* ``DraftInputs``: the draft's architecture (``DraftConfig`` for the target's HF config), the frozen
  target tensors (embedding, ``lm_head``) and the vocab map, loaded once per run (``load_inputs``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel
from safetensors.torch import load_file

from eagle3.config.pipeline import PipelineConfig
from eagle3.config.train import DraftKey
from eagle3.model.draft import DraftConfig
from eagle3.model.export_format import target_ids
from eagle3.model.target_weights import TargetHead, load_target_head
from eagle3.rundir.runroot import fingerprint
from eagle3.target_io import load_hf_config


def draft_key(section: BaseModel) -> dict[str, Any]:
    """The fields of ``section`` that enter a draft's fingerprint, as JSON: all but the operational
    and start ones, an added one only when set off its default, a sub-section by the same rule
    (``DraftKey``)."""
    dumped = section.model_dump(mode="json")
    key: dict[str, Any] = {}
    for name, field in type(section).model_fields.items():
        role = next((m.role for m in field.metadata if isinstance(m, DraftKey)), None)
        if role in ("operational", "start"):
            continue
        value = getattr(section, name)
        if role == "added" and _json(value) == _json(field.get_default(call_default_factory=True)):
            continue
        key[name] = draft_key(value) if isinstance(value, BaseModel) else dumped[name]
    return key


def _json(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def draft_fingerprint(
    config: PipelineConfig, features_fp: str, vocab_fp: str, start: dict[str, Any] | None = None
) -> str:
    """Stage fingerprint of a draft: features, vocab, the result-relevant train config
    (``draft_key``), the target, and, for a night built on the champion, its start
    (``Start.identity``: the champion's id, replay, lr scale)."""
    parts = (
        "draft",
        features_fp,
        vocab_fp,
        draft_key(config.train),
        config.target.model_dump(mode="json"),
    )
    return fingerprint(*parts, start) if start else fingerprint(*parts)


@dataclass
class DraftInputs:
    """Everything besides data that defines a draft run: its architecture, the frozen target
    tensors, the vocab."""

    draft_config: DraftConfig
    head: TargetHead
    d2t: torch.Tensor

    @property
    def draft_ids(self) -> torch.Tensor:
        """Target id of each draft id (the export format's d2t rule), on ``d2t``'s device."""
        return target_ids(self.d2t)

    def to(self, device: torch.device) -> DraftInputs:
        """The frozen target tensors and the vocab map on the training device, placed once per run.
        Moving them in every step copied the target's embedding and ``lm_head`` host-to-device at
        each step: 2 x 2.35 GB in bf16 for Kimi-K2.5 (vocab 163,840 x H 7168), ~0.2-0.5 s of
        synchronous copy per step, on every rank at once. Resident, they cost that memory once per
        GPU (a tied head is moved once)."""
        embed = self.head.embed.to(device)
        lm_head = embed if self.head.tied else self.head.lm_head.to(device)
        return replace(
            self,
            head=TargetHead(embed=embed, lm_head=lm_head, tied=self.head.tied),
            d2t=self.d2t.to(device),
        )


def load_inputs(config: PipelineConfig, vocab_path: Path) -> DraftInputs:
    """Draft architecture from the target's HF config, the frozen target tensors and the draft
    vocab."""
    vocab = load_file(str(vocab_path))
    hf_config = load_hf_config(config.target)
    draft_config = draft_config_for(config, hf_config, draft_vocab_size=len(vocab["d2t"]))
    return DraftInputs(
        draft_config=draft_config, head=target_head(config, hf_config), d2t=vocab["d2t"].long()
    )


def draft_config_for(
    config: PipelineConfig, hf_config: Any, *, draft_vocab_size: int
) -> DraftConfig:
    """The draft architecture this config trains for the target ``hf_config`` describes."""
    return DraftConfig.from_target_config(
        hf_config,
        draft_vocab_size=draft_vocab_size,
        max_position_embeddings=max(
            config.target.context_length, config.export.max_position_embeddings or 0
        ),
        intermediate_size=config.train.draft_intermediate_size,
        **config.train.architecture.model_dump(),
    )


def target_head(config: PipelineConfig, hf_config: Any) -> TargetHead:
    """The frozen target embedding and ``lm_head`` (tied or not, as the target's HF config says)."""
    text_config = getattr(hf_config, "text_config", None) or hf_config
    return load_target_head(
        config.target.model_path,
        revision=config.target.revision,
        tie_word_embeddings=getattr(text_config, "tie_word_embeddings", None),
    )
