"""The ``target`` section of the pipeline config: the served target model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from eagle3.config.aux_layers import TARGET_FAMILIES, TargetFamily, family_error
from eagle3.config.base import StrictModel


class TargetConfig(StrictModel):
    """The served target model. ``model_path`` is a Hub id or a local directory.

    ``family`` names how SGLang reads the draft's layer ids for this target (module docstring):
    ``llama`` (the default: Llama, Qwen and other dense targets) or ``deepseek`` (DeepSeek-V2/V3,
    Kimi-K2/K2.5)."""

    model_path: str
    family: TargetFamily = "llama"
    revision: str | None = None
    num_layers: int = Field(gt=3)
    hidden_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    context_length: int = Field(default=4096, gt=0)
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    trust_remote_code: bool = False
    checkpoint_bytes: int | None = Field(
        default=None,
        gt=0,
        description="The checkpoint's size as stored (its safetensors files): the capture memory plan's weights when "
        "the headers cannot be read (offline). None: read from the headers.",
    )

    @field_validator("family", mode="before")
    @classmethod
    def _named_family(cls, value: Any) -> Any:
        if value not in TARGET_FAMILIES:
            raise ValueError(family_error(value))
        return value
