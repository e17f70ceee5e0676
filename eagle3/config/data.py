"""The ``sources``, ``mix`` and ``normalize`` sections of the pipeline config: what prompts are
drawn from."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from eagle3.config.base import StrictModel


class SourceConfig(StrictModel):
    """One dataset to draw prompts from. ``adapter`` names a catalog entry (``eagle3 datasets
    list``)."""

    adapter: str
    path: str | None = None
    hub_id: str | None = None
    revision: str | None = None
    subset: str | None = None
    split: str | None = None
    weight: float = Field(default=1.0, gt=0)
    max_rows: int | None = Field(default=None, gt=0)
    columns: dict[str, str] = Field(default_factory=dict)
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.adapter


class MixConfig(StrictModel):
    """How many prompts to take in total and how to split them across sources (weights, per-source
    caps)."""

    total: int | None = Field(default=None, gt=0)
    seed: int = 0


class NormalizeConfig(StrictModel):
    system_prompt_policy: Literal["keep", "drop", "replace"] = "keep"
    system_prompt: str | None = None
    max_prompt_tokens: int = Field(default=2048, gt=0)
    max_message_chars: int = Field(default=32_000, gt=0)
    shard_size: int = Field(default=1000, gt=0)
    near_dup_threshold: float = Field(default=0.9, gt=0, le=1)
    minhash_num_perm: int = Field(default=64, ge=16)
    decontam_ngram: int = Field(default=13, ge=3)
    decontam_threshold: float = Field(default=0.5, gt=0, le=1)

    @model_validator(mode="after")
    def _replace_needs_prompt(self) -> NormalizeConfig:
        if self.system_prompt_policy == "replace" and not self.system_prompt:
            raise ValueError(
                "system_prompt_policy 'replace' needs normalize.system_prompt set to the new prompt"
            )
        return self
