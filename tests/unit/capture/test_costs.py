"""train.features: operational (the draft's fingerprint is the same either way), the cost table, the
auto rule."""

from __future__ import annotations

import pytest

from eagle3.capture.costs import choose_features, cost_table, night_costs
from eagle3.config.base import ConfigError
from eagle3.config.pipeline import with_overrides
from eagle3.recipes import load_recipe
from eagle3.train.identity import draft_fingerprint


def test_online_settings_leave_the_draft_fingerprint_as_stored_training_has_it():
    base = load_recipe("kimi_k2_5")
    online = with_overrides(
        base, ["train.features=online", "train.online.max_inflight=2", "train.online.producers=4"]
    )
    assert draft_fingerprint(online, "f", "v") == draft_fingerprint(base, "f", "v")
    assert base.train.features == "stored"  # the default is today's path


def test_an_unknown_features_mode_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"train\.features: .*stored.*online.*auto"):
        with_overrides(load_recipe("tiny"), ["train.features=streamed"])


def test_online_costs_no_disk_and_recaptures_every_epoch():
    config = with_overrides(load_recipe("kimi_k2_5"), ["train.epochs=3"])
    costs = night_costs(config)
    assert costs.stored_disk_bytes > 2e12  # terabytes a night at Kimi-K2.5's scale
    assert costs.online_gpu_hours == pytest.approx(3 * costs.stored_gpu_hours)
    table = cost_table(config)
    assert table["online"]["disk"] == "0 B" and "TB" in table["stored"]["disk"]
    slower = with_overrides(config, ["train.online.prefill_tokens_per_s=20000"])
    assert night_costs(slower).capture_gpu_hours_per_epoch == pytest.approx(
        2 * costs.capture_gpu_hours_per_epoch
    )


def test_auto_stores_what_fits_the_disk_budget_and_streams_what_does_not():
    config = load_recipe("kimi_k2_5")
    need = night_costs(config).stored_disk_bytes
    roomy = with_overrides(
        config, ["train.features=auto", f"train.online.disk_budget_bytes={need * 2}"]
    )
    tight = with_overrides(
        config, ["train.features=auto", f"train.online.disk_budget_bytes={need // 2}"]
    )
    assert choose_features(roomy)[0] == "stored"
    mode, why = choose_features(tight)
    assert mode == "online" and "auto -> online" in why and "available" in why
    assert choose_features(with_overrides(config, ["train.features=online"]))[0] == "online"


def test_auto_decides_from_the_regen_shards_real_tokens_and_estimates_only_before_regen_has_run(
    tiny_config, write_regen_stage, tmp_path
):
    import pyarrow.parquet as pq

    from eagle3.capture.encoding import bytes_per_token
    from eagle3.capture.shard import features_fingerprint
    from eagle3.rundir.layout import stage_dir

    base = with_overrides(
        tiny_config,
        [
            f"root={tmp_path / 'root'}",
            "train.features=auto",
            "mix.total=100000",
            "capture.disk_reserve_bytes=0",
        ],
    )
    regen = write_regen_stage(base.root_path / "regen" / "regenfp", shards=2, rows=5, seed=3)
    shards = sorted(regen.glob("shard-*.parquet"))
    tokens = [
        sum(len(ids) for ids in pq.read_table(s, columns=["input_ids"]).column(0).to_pylist())
        for s in shards
    ]
    c = base.capture
    per_token = bytes_per_token(c.encoding, c.dtype, base.target.hidden_size, topk=c.topk)
    # the estimate is far off here
    assert sum(tokens) * per_token * 10 < night_costs(base).stored_disk_bytes
    # counted: fits
    config = with_overrides(base, [f"train.online.disk_budget_bytes={sum(tokens) * per_token}"])

    counted = choose_features(config, regen_dir=regen)
    assert counted.mode == "stored"
    assert f"counted: {sum(tokens):,} tokens in 2 regen shards" in counted.why
    estimated = choose_features(config)  # before regen: mix.total x the mean sample
    assert estimated.mode == "online" and "estimated: mix.total x" in estimated.why

    features = stage_dir(config.root_path, "capture", features_fingerprint(config, regen.name))
    features.mkdir(parents=True)
    # shard 0's features exist: their disk is already spent
    (features / shards[0].name).write_bytes(b"")
    tight = with_overrides(config, [f"train.online.disk_budget_bytes={tokens[1] * per_token}"])
    again = choose_features(tight, regen_dir=regen)
    assert again.mode == "stored"
    assert f"counted: {tokens[1]:,} tokens in 2 regen shards, 1 already captured" in again.why
    tighter = with_overrides(tight, ["train.online.disk_budget_bytes=1"])
    assert choose_features(tighter, regen_dir=regen).mode == "online"
