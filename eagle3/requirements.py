"""What a config needs installed, checked before anything runs: a night whose mode needs a package
that is not installed is refused at plan time, in one line that names the extra to install, instead
of failing at its train stage after hours of regeneration.

Each optional mode is a ``Requirement`` in a registry: the stages that need it, when it applies to a
config, and a check that says what is missing (None when nothing is). ``missing(config, stages)``
runs the checks of those stages; ``check_requirements`` raises ``MissingRequirement`` (a
``ConfigError``: exit 2, no traceback) with every missing one. ``eagle3 run`` and the
``data-scaling`` flow check every stage; a stage's own command checks its own.

A package is looked up with ``importlib.util.find_spec`` (nothing is imported, so a check costs
microseconds); SGLang on a CPU is the project's runtime, a separate interpreter, probed once.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from eagle3.config.base import ConfigError
from eagle3.config.capture import DEVICE_MAP_STRATEGIES
from eagle3.config.pipeline import PipelineConfig
from eagle3.serve.launch_commands import (
    EngineUnavailable,
    check_sglang_runtime,
    sglang_runtime_python,
)

logger = logging.getLogger(__name__)

STAGES = ("discover", "normalize", "regen", "capture", "vocab", "train", "export", "gate")
Check = Callable[[PipelineConfig], "str | None"]


class MissingRequirement(ConfigError):
    """A mode of the config needs a package that is not installed; the message names its extra."""


@dataclass(frozen=True)
class Requirement:
    name: str
    stages: tuple[str, ...]  # the stages that need it
    applies: Callable[[PipelineConfig], bool]
    check: Check  # what is missing, as the one line a user reads; None when nothing is


REQUIREMENTS: dict[str, Requirement] = {}


def requirement(
    name: str, *, stages: Iterable[str], applies: Callable[[PipelineConfig], bool]
) -> Callable[[Check], Check]:
    """Register ``check`` as the requirement ``name`` (a duplicate name is an error)."""

    def register(check: Check) -> Check:
        if name in REQUIREMENTS:
            raise ValueError(f"requirement {name!r} is registered twice")
        unknown = set(stages) - set(STAGES)
        if unknown:
            raise ValueError(
                f"requirement {name!r} names unknown stages {sorted(unknown)}: use {STAGES}"
            )
        REQUIREMENTS[name] = Requirement(name, tuple(stages), applies, check)
        return check

    return register


def missing(config: PipelineConfig, stages: Iterable[str] = STAGES) -> list[str]:
    """What ``config`` needs for ``stages`` and does not have, one line each."""
    wanted = set(stages)
    return [
        line
        for req in REQUIREMENTS.values()
        if wanted & set(req.stages) and req.applies(config)
        for line in [req.check(config)]
        if line
    ]


def check_requirements(config: PipelineConfig, stages: Iterable[str] = STAGES) -> None:
    """Raise ``MissingRequirement`` when ``stages`` under ``config`` need a missing package."""
    lines = missing(config, stages)
    if lines:
        raise MissingRequirement("; ".join(lines))


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (looked up, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _extra(extra: str) -> str:
    return f"pip install 'eagle3-pipeline[{extra}]'"


@requirement(
    "ray for online training",
    stages=("train",),
    applies=lambda c: c.train.features in ("online", "auto"),
)
def _online_ray(config: PipelineConfig) -> str | None:
    if installed("ray"):
        return None
    chooses = "trains online" if config.train.features == "online" else "may choose online training"
    return (
        f"train.features={config.train.features} {chooses}, through Ray, which is not installed: "
        f"{_extra('ray')}, or set train.features=stored"
    )


@requirement(
    "prefect-ray for the ray task runner",
    stages=("regen", "capture"),
    applies=lambda c: c.orchestration.task_runner == "ray",
)
def _ray_runner(config: PipelineConfig) -> str | None:
    absent = [name for name in ("prefect_ray", "ray") if not installed(name)]
    if not absent:
        return None
    return (
        f"orchestration.task_runner=ray runs shards on Ray, and {' and '.join(absent)} is not "
        f"installed: {_extra('ray')}, or set orchestration.task_runner=thread"
    )


def _launches_servers(config: PipelineConfig) -> bool:
    return config.server.engine == "sglang"


@requirement("SGLang for server.engine=sglang", stages=("regen", "gate"), applies=_launches_servers)
def _sglang_engine(config: PipelineConfig) -> str | None:
    if config.server.device == "cpu":
        return _cpu_runtime()
    if installed("sglang"):
        return None
    return (
        f"server.engine=sglang launches SGLang with this interpreter, which has no SGLang: "
        f"{_extra('sglang')}, or set server.engine=reference"
    )


@requirement(
    "SGLang for capture.backend=sglang",
    stages=("capture",),
    applies=lambda c: c.capture.backend == "sglang",
)
def _sglang_capture(config: PipelineConfig) -> str | None:
    if config.capture.device == "cpu":
        return _cpu_runtime()
    python = os.environ.get("EAGLE3_SGLANG_PYTHON")
    if python:
        return None if Path(python).exists() else f"EAGLE3_SGLANG_PYTHON={python} does not exist"
    if installed("sglang"):
        return None
    return (
        f"capture.backend=sglang runs SGLang's model runner, and this interpreter has no SGLang: "
        f"{_extra('sglang')} (or set EAGLE3_SGLANG_PYTHON), or set capture.backend=hf"
    )


def _cpu_runtime() -> str | None:
    try:
        check_sglang_runtime(sglang_runtime_python())
    except EngineUnavailable as exc:
        return str(exc)
    return None


@requirement(
    "accelerate for capture.device=auto",
    stages=("capture",),
    applies=lambda c: c.capture.backend == "hf" and c.capture.device in DEVICE_MAP_STRATEGIES,
)
def _accelerate(config: PipelineConfig) -> str | None:
    if installed("accelerate"):
        return None
    return (
        f"capture.device={config.capture.device} spreads the target over GPUs with transformers' "
        f"device_map, which needs accelerate: {_extra('multigpu')}, or set capture.device to one "
        "device (cuda)"
    )


def _compressed_tensors(config: PipelineConfig) -> str | None:
    if installed("compressed_tensors"):
        return None
    # imports torch: only when compressed-tensors is missing
    from eagle3.capture.footprint import quantization_config

    try:
        quant = quantization_config(config.target.model_path, config.target.revision)
    except Exception as exc:  # unreadable here (offline, no cache): loading the target will say why
        logger.debug("could not read %s's quantization config: %s", config.target.model_path, exc)
        return None
    if quant.get("quant_method") != "compressed-tensors":
        return None
    return (
        f"the target {config.target.model_path} is a compressed-tensors checkpoint, which "
        f"transformers loads with compressed-tensors, not installed: {_extra('quantized')}"
    )


requirement(
    "compressed-tensors for the hf capture",
    stages=("capture",),
    applies=lambda c: c.capture.backend == "hf",
)(_compressed_tensors)
requirement(
    "compressed-tensors for the reference server",
    stages=("regen", "gate"),
    applies=lambda c: c.server.engine == "reference",
)(_compressed_tensors)
