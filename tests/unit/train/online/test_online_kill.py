"""kill -9 of the trainer or of a producer: every sample trains exactly once per epoch (by the
trainer's own log), only what was lost is captured again, and nothing is left in the store."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from tests.unit.train.online.test_online_training import trained_samples

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def ray_local():
    import ray

    from eagle3.train.online.transport import connect

    connect(None)
    yield ray
    ray.shutdown()


def _exactly_once(online_world, out_dir, epochs):
    ids = sorted(s.sample_id for s in online_world.samples)
    assert [sorted(e) for e in trained_samples(out_dir)] == [ids] * epochs


def _wait_for(predicate, what, timeout=300):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_producer_killed_mid_batch_recaptures_only_its_undelivered_batch(
    online_world, ray_local, tmp_path
):
    from eagle3.train.online.run import train_in_process
    from eagle3.train.online.status import read_online_status
    from eagle3.train.online.transport import get_broker

    config = online_world.config
    out = tmp_path / "draft"
    killed = {}

    def kill_after_two(producers):
        def run():
            broker = get_broker(f"broker-{out.name}")
            _wait_for(
                lambda: ray_local.get(broker.status.remote())["delivered"] >= 2, "two deliveries"
            )
            pid = ray_local.get(producers.actors[0].pid.remote())
            _wait_for(
                lambda: "p0" in ray_local.get(broker.status.remote())["claims"].values(),
                "a claim in flight",
            )
            os.kill(pid, signal.SIGKILL)  # 1 s between its claim and its forward: mid-batch
            killed["pid"] = pid

        threading.Thread(target=run, daemon=True).start()

    result = train_in_process(
        config, online_world.regen, online_world.vocab, out, slow_s=1.0, on_producers=kill_after_two
    )
    assert killed
    store = result["store"]
    assert store["ready"] == 0 and store["consumed"] == store["total"] == result["steps"]
    # nothing delivered was redone
    assert store["delivered"] == store["total"] and store["duplicates"] == 0
    assert store["reclaimed"] >= 1  # the batch in the dead producer's hands was
    _exactly_once(online_world, out, config.train.epochs)
    # what the UI's producer table shows: which batch, and why
    (p0,) = read_online_status(out)["producers"]
    assert p0["restarts"] == 1 and p0["state"] == "done" and len(p0["released"]) == 1
    assert p0["last_error"].startswith(f"batch {p0['released'][0]}: ActorUnavailableError: ")


@pytest.mark.parametrize("producer_too", [False, True], ids=["trainer", "trainer-and-producer"])
def test_trainer_killed_mid_epoch_resumes_from_its_checkpoint(
    online_world, ray_local, tmp_path, producer_too
):
    from eagle3.config.pipeline import with_overrides
    from eagle3.train.checkpoint import latest_checkpoint
    from eagle3.train.online.run import finish_run, open_run, start_producers
    from eagle3.train.workers import worker_command

    # 6 steps an epoch: a checkpoint mid-epoch
    config = with_overrides(online_world.config, ["train.save_every=3"])
    out = tmp_path / "draft"
    out.mkdir()
    config_yaml = tmp_path / "config.yaml"
    config_yaml.write_text(config.to_yaml())
    plan, name = open_run(config, online_world.regen, out, world_size=1)
    producers = start_producers(config, online_world.regen, 1, name)
    address = ray_local.get_runtime_context().gcs_address
    online = ["--regen", str(online_world.regen), "--ray-address", address, "--broker", name]
    command = worker_command(config_yaml, online_world.vocab, out, online)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    log = out / "trained-rank0.jsonl"
    try:
        first = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        save_every = config.train.save_every
        _wait_for(
            lambda: (
                latest_checkpoint(out / "ckpt") is not None
                and log.exists()
                and len(log.read_text().splitlines()) >= save_every + 1
            ),
            "a checkpoint and a batch after it",
        )
        first.send_signal(signal.SIGKILL)
        if producer_too:  # the producer dies with it, holding what it had claimed
            os.kill(ray_local.get(producers.actors[0].pid.remote()), signal.SIGKILL)
        first.wait()
        taken = len(log.read_text().splitlines())
        assert taken % plan.steps_per_epoch and taken > int(
            latest_checkpoint(out / "ckpt").name.split("-")[1]
        )
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert "resumed from" in second.stdout + second.stderr
    finally:
        producers.stop()
        store = finish_run(name)
    assert store["ready"] == 0 and store["consumed"] >= store["total"]
    assert not producers.errors
    _exactly_once(online_world, out, config.train.epochs)
