"""Task runners from config: threads by default, a Ray cluster for shard scale-out
(docs/DESIGN.md, "Prefect usage").

A sharded stage flow (regen, capture) submits its shard tasks to :func:`shard_runner`, built from
the config the flow is given: a flow's decorated task runner is fixed at import time, so choosing it
there (or in every caller) could not follow the config. One config key thus moves regen and capture
shards from local threads onto a Ray cluster, whoever calls the flow (the CLI, the pipeline, a
deployment). ``prefect-ray`` is an optional extra (``pip install 'eagle3-pipeline[ray]'``) imported
only when asked for. On a GPU cluster every capture shard task asks Ray for one GPU
(``remote_options(num_gpus=1)``), so Ray packs one capture task per device, and a capture that
spreads the target over a node's GPUs (``capture.device=auto``, or ``capture.backend=sglang`` on
CUDA: a rank per GPU) asks for all of them (``capture.gpus``): Ray does not keep a task that asks
for no GPU off any (no ``CUDA_VISIBLE_DEVICES`` is set for it), so without the reservation several
capture tasks would load the target onto the same GPUs. Regen shards stay CPU tasks (they only drive
HTTP clients against the SGLang servers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from eagle3.config.base import ConfigError
from eagle3.config.capture import DEVICE_MAP_STRATEGIES
from eagle3.config.orchestration import OrchestrationConfig
from eagle3.config.pipeline import PipelineConfig

ShardStage = Literal["regen", "capture"]
RAY_INSTALL_HINT = "install the extra: pip install 'eagle3-pipeline[ray]' (prefect-ray and ray)"


def build_task_runner(orchestration: OrchestrationConfig) -> TaskRunner[Any]:
    """``ThreadPoolTaskRunner(max_workers)`` or ``RayTaskRunner(address)``; no address starts a
    local Ray."""
    if orchestration.task_runner == "thread":
        return ThreadPoolTaskRunner(max_workers=orchestration.max_workers)
    try:
        from prefect_ray import RayTaskRunner
    except ImportError:
        raise ConfigError(
            f"orchestration.task_runner=ray needs prefect-ray: {RAY_INSTALL_HINT}"
        ) from None
    init_kwargs: dict[str, Any] = {}
    if orchestration.ray_address is None:
        # A local cluster sized by max_workers, so a laptop run does not take every core.
        init_kwargs["num_cpus"] = orchestration.max_workers
    return RayTaskRunner(address=orchestration.ray_address, init_kwargs=init_kwargs)


def shard_resources(config: PipelineConfig, stage: ShardStage) -> dict[str, Any]:
    """Ray ``@remote`` options for one shard task of ``stage`` (empty on the thread runner)."""
    if config.orchestration.task_runner != "ray":
        return {}
    spread = config.capture.device in DEVICE_MAP_STRATEGIES or (
        config.capture.backend == "sglang" and config.capture.device == "cuda"
    )
    if stage == "capture" and spread:
        # the GPUs the target spreads over, held by this task alone
        return {"num_gpus": config.capture.gpus}
    if stage == "capture" and config.capture.device.startswith("cuda"):
        return {"num_gpus": 1}
    return {"num_cpus": 1}


@contextlib.contextmanager
def shard_runner(config: PipelineConfig, stage: ShardStage) -> Iterator[TaskRunner[Any]]:
    """The config's task runner, started for the block, with ``stage``'s placement applied: submit
    the shard tasks with ``runner.submit(task, parameters)`` and wait for them inside the block
    (leaving it shuts the runner down)."""
    with build_task_runner(config.orchestration) as runner, shard_placement(config, stage):
        yield runner


@contextlib.contextmanager
def shard_placement(config: PipelineConfig, stage: ShardStage) -> Iterator[dict[str, Any]]:
    """Apply :func:`shard_resources` to every task submitted inside the block (a no-op without
    Ray)."""
    options = shard_resources(config, stage)
    if not options:
        yield options
        return
    from prefect_ray.context import remote_options

    with remote_options(**options):
        yield options
