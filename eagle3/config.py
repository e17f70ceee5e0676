"""Typed, nested configuration of the whole pipeline.

One pydantic model per component, unknown keys rejected everywhere (``extra="forbid"``), validated once at load.
Errors name the fix. YAML in and out; ``--set a.b=c`` overrides are applied to the plain dict before validation so
that a bad override fails exactly like a bad file.

Layer ids and target families are the SGLang contract of ``eagle3.layers``; this module validates a config
against it. The regen and capture sections live in ``eagle3.config_regen`` and ``eagle3.config_capture``
(re-exported here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from eagle3.config_base import StrictModel as StrictModel  # re-exported
from eagle3.config_capture import DEVICE_MAP_STRATEGIES as DEVICE_MAP_STRATEGIES  # re-exported
from eagle3.config_capture import CaptureConfig, check_capture_gpus
from eagle3.config_capture import SGLangCaptureConfig as SGLangCaptureConfig  # re-exported
from eagle3.config_gate import GateConfig, SpeculativeConfig
from eagle3.config_regen import RegenConfig
from eagle3.config_scaling import ScalingConfig
from eagle3.layers import (
    TARGET_FAMILIES,
    LayerConvention,
    TargetFamily,
    default_aux_layers,
    family_error,
    serving_problem,
    to_export_ids,
    to_sglang_ids,
)


class ConfigError(ValueError):
    """A configuration that cannot run; the message says how to fix it."""


class TargetConfig(StrictModel):
    """The served target model. ``model_path`` is a Hub id or a local directory.

    ``family`` names how SGLang reads the draft's layer ids for this target (module docstring): ``llama`` (the
    default: Llama, Qwen and other dense targets) or ``deepseek`` (DeepSeek-V2/V3, Kimi-K2/K2.5)."""

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


class SourceConfig(StrictModel):
    """One dataset to draw prompts from. ``adapter`` names a catalog entry (``eagle3 datasets list``)."""

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
    """How many prompts to take in total and how to split them across sources (weights, per-source caps)."""

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
            raise ValueError("system_prompt_policy 'replace' needs normalize.system_prompt set to the new prompt")
        return self




class VocabConfig(StrictModel):
    draft_vocab_size: int = Field(default=32_000, gt=0)


class DraftArchitectureConfig(StrictModel):
    """The draft head's variant (``eagle3.model.draft``): all off is EAGLE-3; ``fc_norm`` + ``norm_output`` is
    EAGLE 3.1 (arXiv 2605.09992); ``norm_before_fc`` is SGLang's third variant (one norm over the concatenated aux
    states). Each is written to the export's ``config.json`` as SGLang 0.5.23 reads it."""

    fc_norm: bool = False
    norm_output: bool = False
    norm_before_fc: bool = False


LossKind = Literal["kl", "lk_alpha", "lk_lambda"]


class TrainConfig(StrictModel):
    """``loss`` (``eagle3.train.objectives``): ``kl`` soft cross-entropy to the target (forward KL, EAGLE-3's);
    ``lk_alpha`` -log of the acceptance rate alpha = sum_v min(p, q); ``lk_lambda`` w*KL + (1-w)*(1-alpha) with
    w = lk_kl_scale*exp(-lk_kl_decay*mean(alpha)), KL-led while alpha is low (LK losses, arXiv 2602.23881)."""

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
    nproc: int = Field(default=1, gt=0)
    device: str = "auto"
    save_every: int = Field(default=500, gt=0)
    keep_last: int = Field(default=3, gt=0)
    log_every: int = Field(default=10, gt=0)
    draft_intermediate_size: int | None = Field(default=None, gt=0)
    architecture: DraftArchitectureConfig = Field(default_factory=DraftArchitectureConfig)
    loss: LossKind = "kl"
    lk_kl_scale: float = Field(default=1.0, ge=0, le=1)
    lk_kl_decay: float = Field(default=3.0, ge=0)

    # issue 48 (eagle3.online): where training's hidden states come from; operational (not in the draft's
    # fingerprint: the same regen shards and seed give the same draft either way)
    features: Literal["stored", "online", "auto"] = Field(
        default="stored",
        description="stored: train on feature shards (capture writes them first); online: capture workers hand "
        "feature batches to the trainer through train.online.transport, no feature shard is written; auto: online "
        "when the night's stored features do not fit the disk (eagle3.online.costs says why).",
    )
    online: OnlineConfig = Field(default_factory=lambda: OnlineConfig())

    # Nights that build on the champion (issue 49, ``eagle3.train.continual``). At their defaults these keys are not
    # part of the draft fingerprint (``eagle3.train.trainer.draft_fingerprint``): existing drafts keep their dirs.
    init: Literal["scratch", "champion"] = Field(
        default="scratch",
        description="scratch: a fresh draft on every row so far; champion: start from the promoted draft's weights "
        "(no optimizer state) and train on the rows it has not seen plus a replay sample of earlier rows.",
    )
    replay: float = Field(
        default=0.5, ge=0, lt=1,
        description="init=champion: share of tonight's training rows drawn (seeded, by sample id) from rows the "
        "champion already trained on; the rest are the new rows. 0: new rows only.",
    )
    champion_lr_scale: float = Field(
        default=0.5, gt=0, le=1,
        description="init=champion: peak lr = train.lr x this (same warmup ratio and cosine decay, over the "
        "shorter run): a fine-tune, not a retrain.",
    )

    @model_validator(mode="after")
    def _lk_weights_need_lk_lambda(self) -> TrainConfig:
        fields = type(self).model_fields
        changed = [k for k in ("lk_kl_scale", "lk_kl_decay") if getattr(self, k) != fields[k].default]
        if changed and self.loss != "lk_lambda":
            raise ValueError(f"train.{changed[0]} weighs KL inside train.loss=lk_lambda only, but train.loss is "
                             f"{self.loss!r}: set train.loss=lk_lambda or drop train.{changed[0]}")
        return self

    @model_validator(mode="after")
    def _champion_nights_read_stored_features(self) -> TrainConfig:
        if self.init == "champion" and self.features != "stored":
            raise ValueError(f"train.init=champion builds on the feature shards the champion trained on (its "
                             f"trained_on.json), which train.features={self.features} does not keep: set "
                             f"train.features=stored or train.init=scratch")
        return self


class OnlineConfig(StrictModel):
    """Online training (``train.features=online``, ``eagle3.online``): producers capture the epoch's batches in its
    planned order and hand them to the trainer through Ray's object store."""

    transport: Literal["ray"] = Field(default="ray", description="ray: Ray's object store (the Mooncake store's "
                                      "PyPI wheel needs libcuda and libibverbs: not on CPU hosts; issue 48 report).")
    producers: int = Field(default=1, gt=0, description="Capture workers (each loads the target: one per GPU, or "
                           "one per SGLang TP group).")
    max_inflight: int = Field(default=8, gt=0, description="Batches the store may hold ahead of the trainer; a "
                              "producer waits beyond it (memory bound: max_inflight x one batch's stored states).")
    claim_timeout_s: float = Field(default=600.0, gt=0, description="Seconds a producer may hold a batch it has not "
                                   "delivered before another producer re-captures it (a delivery after that is "
                                   "dropped by its key).")
    producer_restarts: int = Field(default=3, ge=0, description="Times a producer that dies is restarted; its "
                                   "undelivered batches are re-captured, the delivered ones kept.")
    prefill_tokens_per_s: float = Field(default=40_000.0, gt=0, description="Assumed prefill rate of one capture "
                                        "replica (tokens/s) for the cost table and train.features=auto.")
    disk_budget_bytes: int | None = Field(default=None, gt=0, description="train.features=auto: the disk the "
                                          "night's features may take; None: the free space at the run root.")


class ExportConfig(StrictModel):
    max_position_embeddings: int | None = Field(default=None, gt=0)
    # Hub model card metadata (eagle3.model.export_format.card_metadata): the draft's license, and the target's
    # Hub id when target.model_path is a local directory (the card's base_model; a Hub id model_path is used as is).
    license: str = "other"
    base_model: str | None = None


class ServerLaunchConfig(StrictModel):
    """The engine of every server the pipeline starts, and the flags every arm shares (baseline and speculative must
    agree on all of them). ``engine`` ``sglang`` with ``device`` ``cpu`` is SGLang itself on this CPU, through the
    project's runtime (``infra/dev.sh sglang``; ``eagle3.serve.commands``).

    ``max_running_requests`` is always passed to both arms: left unset, SGLang 0.5.23 caps a speculative server at 48
    running requests (``python/sglang/srt/server_args.py``, ``ServerArgs._handle_speculative_decoding``) but leaves the
    baseline uncapped, so high-concurrency levels would compare different batch limits. 48 keeps SGLang's cap."""

    engine: Literal["reference", "sglang"] = "reference"
    device: Literal["cuda", "cpu"] = "cuda"
    host: str = "127.0.0.1"
    port: int = Field(default=30000, ge=0, lt=65536)
    tp: int = Field(default=1, gt=0)
    dtype: str = "auto"
    context_length: int | None = Field(default=None, gt=0)
    mem_fraction_static: float | None = Field(default=None, gt=0, le=1)
    max_running_requests: int = Field(default=48, gt=0)
    cuda_graph_max_bs: int | None = Field(default=None, gt=0)
    extra_args: list[str] = Field(default_factory=list)


class OrchestrationConfig(StrictModel):
    task_runner: Literal["thread", "ray"] = "thread"
    max_workers: int = Field(default=4, gt=0)
    ray_address: str | None = None
    progress_every_s: float = Field(default=10.0, gt=0, description="Seconds between refreshes of a running stage's "
                                    "Prefect boards (progress, live unit table, run status); a failed unit and the "
                                    "end refresh at once. Per period, not per unit: each refresh is several API "
                                    "writes and a read of every unit's files.")  # fmt: skip


class MonitorConfig(StrictModel):
    """How a running stage reports itself to a person watching (Prefect artifacts, logs, the CLI bar)."""

    log_every_s: float = Field(default=300.0, gt=0, description="Seconds between the stage status log lines.")
    rate_window_s: float = Field(default=300.0, gt=0, description="Seconds the throughput and ETA average over.")


class DevConfig(StrictModel):
    """The offline worlds (``eagle3 dev build-tiny``); only the ``tiny`` recipes enable one. ``world``: the tiny chat
    world, or ``think``, the thinking, tool-calling one (``eagle3.dev.think_world``)."""

    tiny_world: bool = False
    world: Literal["tiny", "think"] = "tiny"
    cache_dir: str | None = None


class PipelineConfig(StrictModel):
    name: str
    root: str
    # The id in the run root's marker (eagle3.runroot) that workers must find at flow start: set by
    # `deployments/deploy.py apply`, so a worker without the shared mount fails fast. None: claimed at first use.
    root_id: str | None = None
    target: TargetConfig
    sources: list[SourceConfig] = Field(default_factory=list)
    mix: MixConfig = Field(default_factory=MixConfig)
    normalize: NormalizeConfig = Field(default_factory=NormalizeConfig)
    regen: RegenConfig = Field(default_factory=RegenConfig)
    capture: CaptureConfig = Field(default_factory=CaptureConfig)
    vocab: VocabConfig = Field(default_factory=VocabConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    server: ServerLaunchConfig = Field(default_factory=ServerLaunchConfig)
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    dev: DevConfig = Field(default_factory=DevConfig)
    scaling: ScalingConfig = Field(default_factory=ScalingConfig)

    @model_validator(mode="after")
    def _topk_in_vocab(self) -> PipelineConfig:
        if self.capture.encoding == "fp8_topk" and not 1 <= self.capture.topk <= self.target.vocab_size:
            raise ValueError(f"capture.topk={self.capture.topk} is outside [1, target.vocab_size="
                             f"{self.target.vocab_size}]: set capture.topk to a k in that range, e.g. 256")
        return self

    @model_validator(mode="after")
    def _capture_ranks(self) -> PipelineConfig:
        check_capture_gpus(self.capture, self.server.tp)
        return self

    @model_validator(mode="after")
    def _resolve_layers(self) -> PipelineConfig:
        n = self.target.num_layers
        if not self.capture.aux_layers:
            self.capture.aux_layers = (
                default_aux_layers(n)
                if self.capture.layer_convention == "input_of_layer"
                else to_export_ids(default_aux_layers(n), "input_of_layer")
            )
        _check_layers(self.capture.aux_layers, self.capture.layer_convention, n)
        problem = serving_problem(self.sglang_layer_ids, self.target.family)
        if problem:
            layers = f"capture.aux_layers {self.capture.aux_layers} ({self.capture.layer_convention})"
            raise ValueError(f"{layers}: {problem}")
        return self

    @property
    def root_path(self) -> Path:
        return Path(self.root).expanduser()

    @property
    def sglang_layer_ids(self) -> list[int]:
        return to_sglang_ids(self.capture.aux_layers, self.capture.layer_convention)

    @property
    def export_layer_ids(self) -> list[int]:
        return to_export_ids(self.capture.aux_layers, self.capture.layer_convention)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def derived(self) -> dict[str, Any]:
        """Values computed from the config, shown by ``eagle3 config show`` (never read back)."""
        return {
            "capture_layers_input_of_layer": self.sglang_layer_ids,
            "export_layer_ids_output_of_layer": self.export_layer_ids,
        }


def _check_layers(ids: list[int], convention: LayerConvention, num_layers: int) -> None:
    example = (
        default_aux_layers(num_layers)
        if convention == "input_of_layer"
        else to_export_ids(default_aux_layers(num_layers), "input_of_layer")
    )
    fix = f"set capture.aux_layers to 3 ascending ids in the {convention} convention, e.g. {example}"
    if len(ids) != 3:
        raise ValueError(f"capture.aux_layers has {len(ids)} ids {ids}, EAGLE-3 fuses exactly 3: {fix}")
    if len(set(ids)) != 3:
        raise ValueError(f"capture.aux_layers {ids} repeats a layer: {fix}")
    if ids != sorted(ids):
        raise ValueError(f"capture.aux_layers {ids} is not ascending (SGLang concatenates low|mid|high): {fix}")
    low, high = (1, num_layers - 1) if convention == "input_of_layer" else (0, num_layers - 2)
    bad = [i for i in ids if not low <= i <= high]
    if bad:
        raise ValueError(
            f"capture.aux_layers {ids}: ids {bad} are outside [{low}, {high}] for a target with "
            f"num_layers={num_layers} (ids must be < L): {fix}"
        )


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) to a plain config dict, in place."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form a.b=value (e.g. --set train.lr=2e-4)")
        node: Any = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if isinstance(node, list) and part.isdigit():
                node = node[int(part)]
                continue
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(f"override {item!r}: no config section {part!r} (see `eagle3 config show`)")
            node = node[part]
        last = parts[-1]
        value = yaml.safe_load(raw)
        if isinstance(node, list) and last.isdigit():
            node[int(last)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError(f"override {item!r}: {'.'.join(parts[:-1])} is not a section")
    return data


def validate(data: dict[str, Any]) -> PipelineConfig:
    """Validate a plain dict; errors are flattened into one message per problem, each naming the key."""
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "<root>"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = f"unknown key {where!r}: remove it or check the spelling (see `eagle3 config show`)"
            lines.append(f"{where}: {msg}")
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from None


def load_yaml(path: Path, overrides: list[str] | None = None) -> PipelineConfig:
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top level")
    return validate(apply_overrides(data, overrides or []))


def with_overrides(config: PipelineConfig, overrides: list[str]) -> PipelineConfig:
    return validate(apply_overrides(config.model_dump(mode="json"), overrides))
