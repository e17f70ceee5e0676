"""Online training from real SGLang's model-runner capture (``capture.backend=sglang``, SGLang
0.5.23 on this CPU) follows stored training on features SGLang captured from the same regen shards:
the loss at every step and the trained weights within float32 tolerance (the states of the two paths
come from different forward batches: SGLang packs unpadded requests, so they agree to float32
rounding, 1e-4 per state in ``tests/unit/capture``)."""

from __future__ import annotations

import pytest
import torch

from eagle3.config.pipeline import with_overrides
from eagle3.rundir.layout import METRICS_FILE
from eagle3.train.metrics import read_metrics
from tests.unit.train.online.test_online_training import _weights, trained_samples

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def test_online_training_from_sglang_capture_follows_stored_training(
    sglang_python, online_world, tmp_path
):
    import ray

    from eagle3.capture.manifest import finalize_features
    from eagle3.capture.sglang.backend import SGLangBackend
    from eagle3.capture.shard import capture_shard, features_fingerprint
    from eagle3.train.online.run import train_in_process
    from eagle3.train.workers import train

    torch.set_num_threads(1)
    config = with_overrides(
        online_world.config, ["capture.backend=sglang", f"root={tmp_path / 'root'}"]
    )
    backend = SGLangBackend(config)
    try:
        features = tmp_path / "features" / features_fingerprint(config, online_world.regen.name)
        for shard in sorted(online_world.regen.glob("shard-*.parquet")):
            capture_shard(config, shard, features, backend=backend)
        finalize_features(config, features, [0, 1])
        stored = train(config, features, online_world.vocab, tmp_path / "stored")
        online = train_in_process(
            config, online_world.regen, online_world.vocab, tmp_path / "online", backend=backend
        )
    finally:
        backend.close()
        ray.shutdown()
    a, b = (
        read_metrics(tmp_path / "stored" / METRICS_FILE),
        read_metrics(tmp_path / "online" / METRICS_FILE),
    )
    assert online["steps"] == stored["steps"] == len(a) == len(b) > 4
    for x, y in zip(a, b, strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-3)
        assert y["accept_length_sim"] == pytest.approx(x["accept_length_sim"], rel=1e-3)
    wa, wb = _weights(tmp_path / "stored"), _weights(tmp_path / "online")
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-3, atol=1e-4)
    assert online["store"]["ready"] == 0
    ids = sorted(s.sample_id for s in online_world.samples)
    assert [sorted(e) for e in trained_samples(tmp_path / "online")] == [ids] * config.train.epochs
