"""Online training trains the draft stored training trains, exactly once per epoch, with nothing
left behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle3.rundir.layout import METRICS_FILE
from eagle3.train.checkpoint import latest_checkpoint
from eagle3.train.metrics import read_metrics

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def ray_local():
    import ray

    from eagle3.train.online.transport import connect

    connect(None)
    yield
    ray.shutdown()


def _weights(out_dir):
    from safetensors.torch import load_file

    path = latest_checkpoint(out_dir / "ckpt")
    return load_file(str(next(path.glob("model*.safetensors"))))


def trained_samples(out_dir) -> list[list[str]]:
    """Per epoch, every sample id the trainer's own log says it trained on."""
    epochs: dict[int, list[str]] = {}
    for line in (out_dir / "trained-rank0.jsonl").read_text().splitlines():
        record = json.loads(line)
        epochs.setdefault(record["epoch"], []).extend(record["samples"])
    return [epochs[e] for e in sorted(epochs)]


def test_online_training_follows_stored_training_step_by_step(online_world, ray_local, tmp_path):
    from eagle3.train.online.run import train_in_process
    from eagle3.train.workers import train

    config = online_world.config
    stored = train(config, online_world.features, online_world.vocab, tmp_path / "stored")
    online = train_in_process(config, online_world.regen, online_world.vocab, tmp_path / "online")
    assert online["steps"] == stored["steps"] > 4
    a, b = (
        read_metrics(tmp_path / "stored" / METRICS_FILE),
        read_metrics(tmp_path / "online" / METRICS_FILE),
    )
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-4, abs=1e-5)
        assert y["accept_length_sim"] == pytest.approx(x["accept_length_sim"], rel=1e-4)
    assert a[-1]["loss"] < a[0]["loss"]  # it learned: the comparison is between trained drafts
    wa, wb = _weights(tmp_path / "stored"), _weights(tmp_path / "online")
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-3, atol=1e-4)
    assert online["store"]["ready"] == 0 and online["store"]["consumed"] == online["steps"]
    ids = sorted(s.sample_id for s in online_world.samples)
    assert [sorted(e) for e in trained_samples(tmp_path / "online")] == [ids] * config.train.epochs


def test_the_online_train_stage_trains_into_the_stored_drafts_directory_with_the_stored_vocab(
    online_world, ray_local, tmp_path
):
    from eagle3.capture.stage import FeatureSource, feature_source
    from eagle3.config.pipeline import with_overrides
    from eagle3.stage import run_stage
    from eagle3.train.stage import ExportStage, TrainStage
    from eagle3.train.vocab import VocabStage

    config = with_overrides(
        online_world.config, [f"root={tmp_path}", "train.features=online", "train.epochs=1"]
    )
    online, stored = (
        feature_source(config, online_world.regen),
        FeatureSource.stored(online_world.features),
    )
    vocab = run_stage(VocabStage(), config, features=online)
    stored_vocab = run_stage(VocabStage(), config, features=stored)
    from safetensors.torch import load_file

    assert torch.equal(
        load_file(vocab.summary["vocab"])["d2t"], load_file(stored_vocab.summary["vocab"])["d2t"]
    )
    result = run_stage(TrainStage(), config, features=online, vocab=vocab.summary["vocab"])
    stored_plan = TrainStage().plan(config, features=stored, vocab=vocab.summary["vocab"])
    assert result.out_dir == stored_plan.out_dir  # the same draft, whichever path trains it
    assert (
        result.summary["features"] == "online"
        and "train.features=online" in result.summary["features_decision"]
    )
    assert result.summary["store"]["ready"] == 0
    assert result.summary["steps"] == stored_plan.planned_steps
    # what the monitor last reported
    status = json.loads((result.out_dir / "online-status.json").read_text())
    assert status["consumed"] == status["total"] == result.summary["steps"] and status["ready"] == 0
    export = run_stage(
        ExportStage(),
        config,
        draft_dir=result.out_dir,
        vocab=vocab.summary["vocab"],
        features=online,
    )
    exported = json.loads((Path(export.summary["export"]) / "config.json").read_text())
    assert exported["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == config.export_layer_ids


@pytest.mark.slow
def test_two_trainer_ranks_take_disjoint_batches_that_cover_each_epoch_as_stored_ranks_do(
    online_world, ray_local, tmp_path
):
    from eagle3.capture.stage import feature_source
    from eagle3.config.pipeline import with_overrides
    from eagle3.stage import run_stage
    from eagle3.train.online.plan import OnlinePlan
    from eagle3.train.stage import TrainStage
    from eagle3.train.vocab import VocabStage

    config = with_overrides(
        online_world.config,
        [
            f"root={tmp_path}",
            "train.features=online",
            "train.epochs=1",
            "train.nproc=2",
            "train.batch_size=2",
        ],
    )
    online = feature_source(config, online_world.regen)
    vocab = run_stage(VocabStage(), config, features=online)
    result = run_stage(TrainStage(), config, features=online, vocab=vocab.summary["vocab"])
    plan = OnlinePlan.build(config, online_world.regen, world_size=2)
    assert result.summary["steps"] == plan.steps_per_epoch and result.summary["store"]["ready"] == 0
    for rank in (0, 1):
        logged = [
            json.loads(line)["samples"]
            for line in (result.out_dir / f"trained-rank{rank}.jsonl").read_text().splitlines()
        ]
        assert logged == [
            list(plan.key(plan.index(0, step, rank))[3]) for step in range(plan.steps_per_epoch)
        ]


def test_a_night_after_stored_nights_reads_their_shards_and_captures_only_the_new_one(
    online_world, ray_local, tmp_path
):
    """Night 1 was stored (shard 0's features are in this root's features stage); night 2 trains
    online on both regen shards: shard 0's rows are read from its feature shard, shard 1's captured,
    the curve is stored training's."""
    from eagle3.capture.manifest import finalize_features
    from eagle3.capture.shard import capture_shard, features_fingerprint
    from eagle3.config.pipeline import with_overrides
    from eagle3.train.online.plan import OnlinePlan
    from eagle3.train.online.run import train_in_process
    from eagle3.train.workers import train

    config = with_overrides(online_world.config, [f"root={tmp_path / 'root'}"])
    features = (
        tmp_path / "root" / "features" / features_fingerprint(config, online_world.regen.name)
    )
    capture_shard(config, online_world.regen / "shard-00000.parquet", features)
    finalize_features(config, features, [0])
    plan = OnlinePlan.for_night(config, online_world.regen, world_size=1)
    stored_groups = set(plan.stored)
    # some groups read, some captured
    assert stored_groups and len(stored_groups) < len(plan.groups)
    online = train_in_process(config, online_world.regen, online_world.vocab, tmp_path / "mixed")
    train(config, online_world.features, online_world.vocab, tmp_path / "stored")
    a, b = (
        read_metrics(tmp_path / "stored" / METRICS_FILE),
        read_metrics(tmp_path / "mixed" / METRICS_FILE),
    )
    assert len(a) == len(b) == online["steps"]
    for x, y in zip(a, b, strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-4, abs=1e-5)
    assert online["store"]["ready"] == 0
    # shard 0's rows (14 a epoch) read, shard 1's (10) captured
    (counts,) = online["producers"].values()
    assert (counts["samples_read"], counts["samples_captured"]) == (14 * 2, 10 * 2)


def test_joining_ray_keeps_the_process_sigterm_handler():
    """A Ray driver installs ``sys.exit(15)`` for SIGTERM; the pipeline's process keeps its own
    (regen's journal flush and exit 128 + 15, Prefect's cancellation), whichever test or stage
    joined Ray first."""
    import ray

    from eagle3.train.online.transport import connect

    def ours(signum, frame):  # pragma: no cover - never delivered
        raise AssertionError

    before = signal.signal(signal.SIGTERM, ours)
    ray.shutdown()
    try:
        connect(None)
        assert signal.getsignal(signal.SIGTERM) is ours
    finally:
        ray.shutdown()
        signal.signal(signal.SIGTERM, before)


_SESSIONS_IN_TASK_THREADS = """
import threading

import ray

from eagle3.train.online.transport import ray_session

answers = []


def unit():  # a Prefect task thread running an online train unit
    with ray_session(None):
        answers.append(ray.get(ray.put(len(answers)), timeout=120))


for _ in range(2):
    thread = threading.Thread(target=unit)
    thread.start()
    thread.join()
print(answers, ray.is_initialized())
"""


def test_online_units_in_successive_task_threads_each_get_a_live_ray_and_leave_none_behind():
    """Ray SIGKILLs the local cluster it started when the starting *thread* ends (PR_SET_PDEATHSIG):
    a session that outlived its task thread left the process connected to a dead GCS (the next unit
    hung, and the night exited 1 60 s after its gate). Each unit's session now ends inside its
    thread."""
    done = subprocess.run(
        [sys.executable, "-c", _SESSIONS_IN_TASK_THREADS],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[0, 1] False"
