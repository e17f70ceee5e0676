"""Task runners from config: threads by default, Ray for shard scale-out (a real local Ray cluster,
slow)."""

from __future__ import annotations

import os
import signal

import pytest
from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner

from eagle3.config.base import ConfigError
from eagle3.config.orchestration import OrchestrationConfig
from eagle3.config.pipeline import PipelineConfig
from eagle3.recipes import load_recipe
from flows.runners import build_task_runner, shard_placement, shard_resources, shard_runner


def test_thread_runner_by_default_sized_by_max_workers():
    runner = build_task_runner(OrchestrationConfig(max_workers=3))
    assert isinstance(runner, ThreadPoolTaskRunner) and runner._max_workers == 3


def test_ray_runner_without_the_extra_names_the_install_command(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "prefect_ray", None)
    with pytest.raises(ConfigError, match=r"eagle3-pipeline\[ray\]"):
        build_task_runner(OrchestrationConfig(task_runner="ray"))


def test_capture_shards_ask_ray_for_one_gpu_on_cuda_and_for_every_gpu_they_spread_over():
    hf = ["orchestration.task_runner=ray", "capture.backend=hf"]
    ray_gpu = load_recipe("kimi_k2_5", [*hf, "capture.device=cuda"])
    ray_cpu = load_recipe("kimi_k2_5", [*hf, "capture.device=cpu"])
    ray_spread = load_recipe("kimi_k2_5", [*hf, "capture.device=auto"])  # capture.gpus=8
    # sglang on cuda, a rank per GPU
    ray_sglang = load_recipe("kimi_k2_5", ["orchestration.task_runner=ray"])
    threads = load_recipe("kimi_k2_5", ["capture.backend=hf", "capture.device=cuda"])
    assert shard_resources(ray_sglang, "capture") == {"num_gpus": 8}
    assert shard_resources(ray_gpu, "capture") == {"num_gpus": 1}
    assert shard_resources(ray_gpu, "regen") == {"num_cpus": 1}
    assert shard_resources(ray_cpu, "capture") == {"num_cpus": 1}
    assert shard_resources(ray_spread, "capture") == {"num_gpus": 8}
    assert shard_resources(ray_spread, "regen") == {"num_cpus": 1}
    assert shard_resources(threads, "capture") == {}
    with shard_placement(threads, "capture") as options:
        assert options == {}


@task
def _worker_pid(shard: int) -> tuple[int, int]:
    return shard, os.getpid()


@flow
def _shards(config: PipelineConfig, shard_ids: list[int]) -> list[tuple[int, int]]:
    with shard_runner(config, "regen") as runner:
        return [runner.submit(_worker_pid, {"shard": shard}).result() for shard in shard_ids]


def test_shard_runner_runs_shard_tasks_on_threads_in_this_process_by_default(prefect_harness):
    config = load_recipe("tiny", ["orchestration.max_workers=2"])
    results = _shards(config, [0, 1, 2])
    assert sorted(shard for shard, _ in results) == [0, 1, 2]
    assert all(pid == os.getpid() for _, pid in results), (
        "the thread runner runs shard tasks in this process"
    )


@pytest.mark.slow
def test_ray_runner_runs_shard_tasks_in_ray_worker_processes(prefect_harness):
    pytest.importorskip("prefect_ray", reason="needs the [ray] extra")
    config = load_recipe(
        "kimi_k2_5", ["orchestration.task_runner=ray", "orchestration.max_workers=2"]
    )
    results = _shards(config, [0, 1, 2])
    assert sorted(shard for shard, _ in results) == [0, 1, 2]
    assert all(pid != os.getpid() for _, pid in results), (
        "shard tasks ran in the flow process, not on Ray"
    )


@task
def _placement() -> tuple[float, str | None]:
    import ray

    return ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0), os.environ.get(
        "CUDA_VISIBLE_DEVICES"
    )


@flow
def _placed(config: PipelineConfig, stage: str) -> tuple[float, str | None]:
    with shard_runner(config, stage) as runner:
        return runner.submit(_placement, {}).result()


@pytest.mark.slow
def test_on_ray_a_spread_capture_task_holds_every_gpu_of_its_node(prefect_harness):
    """A local Ray node that declares 8 GPUs (Ray assigns declared GPUs as it does real ones): the
    Kimi recipe's capture task holds all 8 and sees them; a regen task holds none, and Ray does not
    hide the GPUs from it, which is why a spread capture that asked for none would share them with
    every other task."""
    ray = pytest.importorskip("ray", reason="needs the [ray] extra")
    config = load_recipe("kimi_k2_5", ["orchestration.task_runner=ray"])
    sigterm = signal.getsignal(signal.SIGTERM)
    # the runner uses a Ray that is already up
    ray.init(num_cpus=2, num_gpus=8, include_dashboard=False)
    # ray.init on the main thread makes SIGTERM exit(15), for later tests too
    signal.signal(signal.SIGTERM, sigterm)
    try:
        capture, regen = _placed(config, "capture"), _placed(config, "regen")
    finally:
        ray.shutdown()
    assert capture == (8.0, "0,1,2,3,4,5,6,7")
    assert regen == (0.0, None)
