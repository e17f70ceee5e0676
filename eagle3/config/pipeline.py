"""The whole pipeline config (``PipelineConfig``): every section (one module each in
``eagle3.config``), the checks that span sections, and the one way in: YAML or a dict, plus ``--set
a.b=c`` overrides.

One pydantic model per component, unknown keys rejected everywhere (``extra="forbid"``), validated
once at load. Errors name the fix. YAML in and out; ``--set a.b=c`` overrides are applied to the
plain dict before validation so that a bad override fails exactly like a bad file.

Layer ids and target families are the SGLang contract of ``eagle3.config.aux_layers``; this module
validates a config against it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from eagle3.config.aux_layers import (
    LayerConvention,
    default_aux_layers,
    serving_problem,
    to_export_ids,
    to_sglang_ids,
)
from eagle3.config.base import ConfigError, StrictModel
from eagle3.config.capture import CaptureConfig, check_capture_gpus
from eagle3.config.data import MixConfig, NormalizeConfig, SourceConfig
from eagle3.config.dev import DevConfig
from eagle3.config.gate import GateConfig, SpeculativeConfig
from eagle3.config.orchestration import MonitorConfig, OrchestrationConfig
from eagle3.config.regen import RegenConfig
from eagle3.config.scaling import ScalingConfig
from eagle3.config.served import ServedConfig
from eagle3.config.server import ServerLaunchConfig
from eagle3.config.target import TargetConfig
from eagle3.config.train import ExportConfig, TrainConfig, VocabConfig

logger = logging.getLogger(__name__)


class PipelineConfig(StrictModel):
    name: str
    root: str
    # The id in the run root's marker (eagle3.rundir.runroot) that workers must find at flow start:
    # set by `deployments/deploy.py apply`, so a worker without the shared mount fails fast. None:
    # claimed at first use.
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
    served: ServedConfig = Field(default_factory=ServedConfig)

    @model_validator(mode="after")
    def _topk_in_vocab(self) -> PipelineConfig:
        if (
            self.capture.encoding == "fp8_topk"
            and not 1 <= self.capture.topk <= self.target.vocab_size
        ):
            raise ValueError(
                f"capture.topk={self.capture.topk} is outside [1, target.vocab_size="
                f"{self.target.vocab_size}]: set capture.topk to a k in that range, e.g. 256"
            )
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
            layers = (
                f"capture.aux_layers {self.capture.aux_layers} ({self.capture.layer_convention})"
            )
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
    fix = (
        f"set capture.aux_layers to 3 ascending ids in the {convention} convention, e.g. {example}"
    )
    if len(ids) != 3:
        raise ValueError(
            f"capture.aux_layers has {len(ids)} ids {ids}, EAGLE-3 fuses exactly 3: {fix}"
        )
    if len(set(ids)) != 3:
        raise ValueError(f"capture.aux_layers {ids} repeats a layer: {fix}")
    if ids != sorted(ids):
        raise ValueError(
            f"capture.aux_layers {ids} is not ascending (SGLang concatenates low|mid|high): {fix}"
        )
    low, high = (1, num_layers - 1) if convention == "input_of_layer" else (0, num_layers - 2)
    bad = [i for i in ids if not low <= i <= high]
    if bad:
        raise ValueError(
            f"capture.aux_layers {ids}: ids {bad} are outside [{low}, {high}] for a target with "
            f"num_layers={num_layers} (ids must be < L): {fix}"
        )


def local_layer_count(model_path: str) -> int | None:
    """``num_hidden_layers`` of a target whose ``config.json`` is on disk (a local checkpoint
    directory), else None."""
    path = Path(model_path).expanduser() / "config.json"
    if not path.is_file():
        return None
    try:
        layers = json.loads(path.read_text()).get("num_hidden_layers")
    except (OSError, ValueError):
        return None
    return layers if isinstance(layers, int) else None


def check_target_layers(config: PipelineConfig) -> None:
    """Raise ``ConfigError`` when ``target.num_layers`` is not the layer count of the checkpoint on
    disk, and warn (one line) when ``capture.aux_layers`` take nothing from the target's upper half:
    a config copied from another target (the tiny recipe's [2, 4, 5] on a 30-layer model) rather
    than a choice."""
    n, ids = config.target.num_layers, config.sglang_layer_ids
    found = local_layer_count(config.target.model_path)
    default = default_aux_layers(found or n)
    if found is not None and found != n:
        raise ConfigError(
            f"target.num_layers={n} but {config.target.model_path} has {found} layers: "
            f"set target.num_layers={found} "
            f"(and capture.aux_layers=[] for SGLang's default {default} in input_of_layer)"
        )
    if max(ids) < n // 2:
        logger.warning(
            "capture.aux_layers %s (input_of_layer %s) take no layer from the upper half of this "
            "%d-layer target; EAGLE-3 fuses a low, a middle and a high layer: set "
            "capture.aux_layers=[] for SGLang's default %s",
            config.capture.aux_layers,
            ids,
            n,
            default,
        )


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) to a plain config dict, in place."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(
                f"override {item!r} is not of the form a.b=value (e.g. --set train.lr=2e-4)"
            )
        node: Any = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if isinstance(node, list) and part.isdigit():
                node = node[int(part)]
                continue
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(
                    f"override {item!r}: no config section {part!r} (see `eagle3 config show`)"
                )
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
    """Validate a plain dict; errors are flattened into one message per problem, each naming the
    key."""
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
