"""The ``vocab``, ``train`` (with ``train.online``) and ``export`` sections of the pipeline
config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, model_validator

from eagle3.config.base import StrictModel


@dataclass(frozen=True)
class DraftKey:
    """How a ``train`` field enters the draft's fingerprint
    (``eagle3.train.identity.draft_fingerprint``), said where the field is declared
    (``Annotated[type, OPERATIONAL]``); a field without a key is part of it, and so is a section's
    (``train.architecture``'s fields), by the same rule."""

    role: Literal["operational", "added", "start"]


# How a run goes (processes, device, checkpoints, logs, where the hidden states come from), not what
# it trains: never in the fingerprint, so the same data, seed and settings give one draft directory
# however they were run.
OPERATIONAL = DraftKey("operational")
# Added after drafts were first fingerprinted: in the fingerprint only when set off its default, so
# every draft trained before it (and every recipe that leaves it alone) keeps its fingerprint and
# its finished directory.
ADDED = DraftKey("added")
# A champion night's start: in the fingerprint only through the start the train stage plans
# (``eagle3.train.continual.Start.identity``), so a scratch night's draft is the same whatever these
# say.
START = DraftKey("start")


class VocabConfig(StrictModel):
    draft_vocab_size: int = Field(default=32_000, gt=0)


MLA_SHAPE = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


class DraftArchitectureConfig(StrictModel):
    """The draft head's variant (``eagle3.model.draft``): all off is EAGLE-3; ``fc_norm`` +
    ``norm_output`` is EAGLE 3.1 (arXiv 2605.09992); ``norm_before_fc`` is SGLang's third variant
    (one norm over the concatenated aux states). Each is written to the export's ``config.json`` as
    SGLang 0.5.23 reads it.

    ``attention``: ``mha`` is the Llama-style head (``LlamaForCausalLMEagle3``); ``mla`` the
    DeepSeek multi-head latent attention head (``Eagle3DeepseekV2ForCausalLM``,
    ``eagle3.model.mla``), the Kimi/DeepSeek drafts' layout. Its sizes (``q_lora_rank``...
    ``v_head_dim``) default to the target's own MLA sizes, or, on a target without MLA, to ones
    derived from its attention (``eagle3.model.mla.mla_shape``); set them to match a parameter
    budget."""

    fc_norm: bool = False
    norm_output: bool = False
    norm_before_fc: bool = False
    attention: Annotated[Literal["mha", "mla"], ADDED] = "mha"
    q_lora_rank: Annotated[int | None, ADDED] = Field(default=None, gt=0)
    kv_lora_rank: Annotated[int | None, ADDED] = Field(default=None, gt=0)
    qk_nope_head_dim: Annotated[int | None, ADDED] = Field(default=None, gt=0)
    qk_rope_head_dim: Annotated[int | None, ADDED] = Field(default=None, gt=0)
    v_head_dim: Annotated[int | None, ADDED] = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _mla_sizes_need_mla(self) -> DraftArchitectureConfig:
        set_sizes = [k for k in MLA_SHAPE if getattr(self, k) is not None]
        if set_sizes and self.attention != "mla":
            raise ValueError(
                f"train.architecture.{set_sizes[0]} sizes the MLA attention, but "
                f"train.architecture.attention is {self.attention!r}: set "
                "train.architecture.attention=mla or drop it"
            )
        if self.qk_rope_head_dim is not None and self.qk_rope_head_dim % 2:
            raise ValueError(
                f"train.architecture.qk_rope_head_dim={self.qk_rope_head_dim} must be even (RoPE "
                "rotates pairs): set an even size"
            )
        return self


LossKind = Literal["kl", "lk_alpha", "lk_lambda"]


class OnlineConfig(StrictModel):
    """Online training (``train.features=online``, ``eagle3.train.online``): producers capture the
    epoch's batches in its planned order and hand them to the trainer through Ray's object store."""

    transport: Literal["ray"] = Field(
        default="ray",
        description="ray: Ray's object store (the Mooncake store's "
        "PyPI wheel needs libcuda and libibverbs: not on CPU hosts).",
    )
    producers: int = Field(
        default=1,
        gt=0,
        description="Capture workers (each loads the target: one per GPU, or "
        "one per SGLang TP group).",
    )
    max_inflight: int = Field(
        default=8,
        gt=0,
        description="Batches the store may hold ahead of the trainer; a "
        "producer waits beyond it (memory bound: max_inflight x one batch's stored states).",
    )
    claim_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Seconds a producer may hold a batch it has not "
        "delivered before another producer re-captures it (a delivery after that is "
        "dropped by its key).",
    )
    producer_restarts: int = Field(
        default=3,
        ge=0,
        description="Times a producer that dies is restarted; its "
        "undelivered batches are re-captured, the delivered ones kept.",
    )
    prefill_tokens_per_s: float = Field(
        default=40_000.0,
        gt=0,
        description="Assumed prefill rate of one capture "
        "replica (tokens/s) for the cost table and train.features=auto.",
    )
    disk_budget_bytes: int | None = Field(
        default=None,
        gt=0,
        description="train.features=auto: the disk the "
        "night's features may take; None: the free space at the run root.",
    )


class TrainConfig(StrictModel):
    """``loss`` (``eagle3.train.objectives``): ``kl`` soft cross-entropy to the target (forward KL,
    EAGLE-3's); ``lk_alpha`` -log of the acceptance rate alpha = sum_v min(p, q); ``lk_lambda`` w*KL
    + (1-w)*(1-alpha) with w = lk_kl_scale*exp(-lk_kl_decay*mean(alpha)), KL-led while alpha is low
      (LK losses, arXiv 2602.23881)."""

    ttt_steps: int = Field(default=7, gt=0)
    step_weight_decay: float = Field(default=0.8, gt=0, le=1)
    lr: float = Field(default=1e-4, gt=0)
    warmup_ratio: float = Field(default=0.015, ge=0, lt=1)
    grad_clip: float = Field(default=0.5, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    epochs: int = Field(default=1, gt=0)
    max_steps: int | None = Field(default=None, gt=0)
    batch_size: int = Field(default=1, gt=0)
    max_seq_len: int = Field(default=4096, gt=0)
    seed: int = 0
    precision: Literal["fp32", "bf16"] = "bf16"
    parallel: Literal["ddp", "fsdp"] = "ddp"
    nproc: Annotated[int, OPERATIONAL] = Field(default=1, gt=0)
    device: Annotated[str, OPERATIONAL] = "auto"
    save_every: Annotated[int, OPERATIONAL] = Field(default=500, gt=0)
    keep_last: Annotated[int, OPERATIONAL] = Field(default=3, gt=0)
    log_every: Annotated[int, OPERATIONAL] = Field(default=10, gt=0)
    draft_intermediate_size: int | None = Field(default=None, gt=0)
    architecture: Annotated[DraftArchitectureConfig, ADDED] = Field(
        default_factory=DraftArchitectureConfig
    )
    loss: Annotated[LossKind, ADDED] = "kl"
    lk_kl_scale: Annotated[float, ADDED] = Field(default=1.0, ge=0, le=1)
    lk_kl_decay: Annotated[float, ADDED] = Field(default=3.0, ge=0)

    # where training's hidden states come from (``eagle3.train.online``): the same regen shards and
    # seed give the same draft either way
    features: Annotated[Literal["stored", "online", "auto"], OPERATIONAL] = Field(
        default="stored",
        description="stored: train on feature shards (capture writes them first); online: capture workers hand "
        "feature batches to the trainer through train.online.transport, no feature shard is written; auto: online "
        "when the night's stored features do not fit the disk (eagle3.capture.costs says why).",
    )
    online: Annotated[OnlineConfig, OPERATIONAL] = Field(default_factory=lambda: OnlineConfig())

    # Nights that build on the champion (``eagle3.train.continual``).
    init: Annotated[Literal["scratch", "champion"], START] = Field(
        default="scratch",
        description="scratch: a fresh draft on every row so far; champion: start from the promoted draft's weights "
        "(no optimizer state) and train on the rows it has not seen plus a replay sample of earlier rows.",
    )
    replay: Annotated[float, START] = Field(
        default=0.5,
        ge=0,
        lt=1,
        description="init=champion: share of tonight's training rows drawn (seeded, by sample id) from rows the "
        "champion already trained on; the rest are the new rows. 0: new rows only.",
    )
    champion_lr_scale: Annotated[float, START] = Field(
        default=0.5,
        gt=0,
        le=1,
        description="init=champion: peak lr = train.lr x this (same warmup ratio and cosine decay, over the "
        "shorter run): a fine-tune, not a retrain.",
    )

    @model_validator(mode="after")
    def _lk_weights_need_lk_lambda(self) -> TrainConfig:
        fields = type(self).model_fields
        changed = [
            k for k in ("lk_kl_scale", "lk_kl_decay") if getattr(self, k) != fields[k].default
        ]
        if changed and self.loss != "lk_lambda":
            raise ValueError(
                f"train.{changed[0]} weighs KL inside train.loss=lk_lambda only, but train.loss is "
                f"{self.loss!r}: set train.loss=lk_lambda or drop train.{changed[0]}"
            )
        return self

    @model_validator(mode="after")
    def _champion_nights_read_stored_features(self) -> TrainConfig:
        if self.init == "champion" and self.features != "stored":
            raise ValueError(
                f"train.init=champion builds on the feature shards the champion trained on (its "
                f"trained_on.json), which train.features={self.features} does not keep: set "
                f"train.features=stored or train.init=scratch"
            )
        return self


class ExportConfig(StrictModel):
    max_position_embeddings: int | None = Field(default=None, gt=0)
    # Hub model card metadata (eagle3.model.export_format.card_metadata): the draft's license, and
    # the target's Hub id when target.model_path is a local directory (the card's base_model; a Hub
    # id model_path is used as is).
    license: str = "other"
    base_model: str | None = None
