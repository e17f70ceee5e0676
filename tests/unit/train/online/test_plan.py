"""The online epoch plan is the stored loader's plan over the shards capture would write."""

from __future__ import annotations

import pyarrow.parquet as pq

from eagle3.capture.manifest import feature_shards
from eagle3.train.data import FeatureDataset
from eagle3.train.online.plan import OnlinePlan


def _stored_groups(features):
    groups = []
    for path in feature_shards(features):
        file = pq.ParquetFile(path)
        for rg in range(file.num_row_groups):
            groups.append(file.read_row_group(rg, columns=["sample_id"]).column(0).to_pylist())
    return groups


def test_predicted_row_groups_are_the_captured_shards_row_groups(online_world):
    plan = OnlinePlan.build(online_world.config, online_world.regen, world_size=1)
    stored = _stored_groups(online_world.features)
    # several row groups per shard: the byte rule is exercised, not one group per shard
    assert len(stored) > 2
    assert [[s.sample_id for s in g] for g in plan.groups] == stored


def test_every_epoch_every_rank_batches_the_samples_the_stored_loader_batches(online_world):
    for world_size in (1, 2):
        plan = OnlinePlan.build(online_world.config, online_world.regen, world_size=world_size)
        for rank in range(world_size):
            loader = FeatureDataset(
                online_world.features,
                batch_size=online_world.config.train.batch_size,
                seed=online_world.config.train.seed,
                rank=rank,
                world_size=world_size,
            )
            for epoch in range(2):
                stored = [[ids for ids in _batch_ids(loader, b)] for b in loader.plan(epoch)]
                online = [
                    list(plan.key(plan.index(epoch, step, rank))[3])
                    for step in range(plan.steps_per_epoch)
                ]
                assert online == stored


def _batch_ids(loader, batch):
    for seq in batch:
        for g, r in seq:
            group = loader.groups[g]
            yield str(loader._files[group.shard].read_column(group.row_group, "sample_id")[r])


def test_plan_keys_each_batch_by_epoch_step_rank_and_samples(online_world):
    plan = OnlinePlan.build(online_world.config, online_world.regen, world_size=2)
    keys = [plan.key(i) for i in range(plan.total_batches)]
    assert len(set(keys)) == len(keys)
    assert [k[:3] for k in keys[:4]] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    # reshuffled per epoch
    assert [k[3] for k in keys if k[0] == 0] != [k[3] for k in keys if k[0] == 1]
    one = OnlinePlan.build(online_world.config, online_world.regen, world_size=1)
    # one rank: every sample once per epoch (ranks drop a surplus tail, as stored)
    for epoch in range(one.epochs):
        ids = [
            sid
            for step in range(one.steps_per_epoch)
            for sid in one.key(one.index(epoch, step, 0))[3]
        ]
        assert sorted(ids) == sorted(s.sample_id for s in online_world.samples)
