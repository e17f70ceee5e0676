"""Task runners from config: threads by default, Ray for shard scale-out (a real local Ray cluster, slow)."""

from __future__ import annotations

import os

import pytest
from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner

from eagle3.config import ConfigError, OrchestrationConfig, PipelineConfig
from eagle3.recipes import load_recipe
from flows.runners import build_task_runner, shard_placement, shard_resources, shard_runner


def test_thread_runner_by_default_sized_by_max_workers():
    runner = build_task_runner(OrchestrationConfig(max_workers=3))
    assert isinstance(runner, ThreadPoolTaskRunner) and runner._max_workers == 3


def test_ray_runner_without_the_extra_names_the_install_command(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "prefect_ray", None)
    with pytest.raises(ConfigError, match=r"eagle3-pipeline\[ray\]"):
        build_task_runner(OrchestrationConfig(task_runner="ray"))


def test_capture_shards_ask_ray_for_one_gpu_only_on_cuda():
    ray_gpu = load_recipe("kimi_k2_5", ["orchestration.task_runner=ray", "capture.device=cuda"])
    ray_cpu = load_recipe("kimi_k2_5", ["orchestration.task_runner=ray", "capture.device=cpu"])
    threads = load_recipe("kimi_k2_5", ["capture.device=cuda"])
    assert shard_resources(ray_gpu, "capture") == {"num_gpus": 1}
    assert shard_resources(ray_gpu, "regen") == {"num_cpus": 1}
    assert shard_resources(ray_cpu, "capture") == {"num_cpus": 1}
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
    assert all(pid == os.getpid() for _, pid in results), "the thread runner runs shard tasks in this process"


@pytest.mark.slow
def test_ray_runner_runs_shard_tasks_in_ray_worker_processes(prefect_harness):
    pytest.importorskip("prefect_ray", reason="needs the [ray] extra")
    config = load_recipe("kimi_k2_5", ["orchestration.task_runner=ray", "orchestration.max_workers=2"])
    results = _shards(config, [0, 1, 2])
    assert sorted(shard for shard, _ in results) == [0, 1, 2]
    assert all(pid != os.getpid() for _, pid in results), "shard tasks ran in the flow process, not on Ray"
