"""The online epoch plan: which samples each training batch holds, decided up front from the regen
shards alone.

Online training (``train.features=online``) writes no feature shard, yet must train on the same
batches, in the same order, as the stored path would on the shards capture writes from the same
regen shards: the same draft either way. The stored loader (``eagle3.train.data.FeatureDataset``)
plans an epoch over Parquet row groups: shuffled from ``seed + epoch``, dealt to ranks, rows
shuffled inside each. So this module predicts those row groups:

* capture keeps the admitted rows of a regen shard (``eagle3.capture.shard.admit``) in the order of
  its forward batches (``plan_batches``: longest first), one part table per batch;
* the shard writer (``eagle3.data.parquet.ShardWriter``) closes a row group after the part whose
  table brings its buffer to ``capture.row_group_bytes`` (Arrow ``nbytes``, uncompressed), so row
  groups end on part boundaries;
* a part's ``nbytes`` is its small columns' Arrow size plus the two state columns' offsets and bytes
  (``bytes_per_token`` of each codec x tokens), computed here without any state.

The planner then *is* the stored loader's: ``EpochPlanner`` borrows ``FeatureDataset``'s planning
methods, so the two cannot drift apart (``tests/unit/online/test_plan.py`` checks the predicted
groups against captured shards). A sample the stored capture quarantines as non-finite has no row
there; online, the batch holding it fails its integrity check instead (a ``DataError`` naming it),
as it would fail a stored step.

Each batch is keyed ``(epoch, step, rank, sample ids)``; its global index ``(epoch * steps + step) *
ranks + rank`` is what producers claim and the broker orders.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from eagle3.capture.encoding import column_codecs
from eagle3.capture.shard import (
    Sample,
    admit,
    features_fingerprint,
    plan_batches,
    read_regen_shard,
    regen_shards,
    shard_index_of,
)
from eagle3.config.pipeline import PipelineConfig
from eagle3.rundir.runroot import fingerprint
from eagle3.train.data import FeatureDataset, RowGroup

Key = tuple[int, int, int, tuple[str, ...]]  # (epoch, step, rank, sample ids)


def _part_nbytes(samples: Sequence[Sample], state_bytes_per_token: int) -> int:
    """Arrow ``nbytes`` of the part table capture writes for ``samples``
    (``eagle3.capture.schema.feature_table``): the small columns built for real, the two binary
    state columns as offsets plus values."""
    small = [
        pa.array([s.sample_id for s in samples], pa.string()),
        pa.array([s.input_ids for s in samples], pa.list_(pa.int32())),
        pa.array([s.loss_mask for s in samples], pa.list_(pa.uint8())),
        pa.array([len(s.input_ids) for s in samples], pa.int32()),
    ]
    tokens = sum(len(s.input_ids) for s in samples)
    return (
        sum(a.nbytes for a in small) + 2 * 4 * (len(samples) + 1) + tokens * state_bytes_per_token
    )


def capture_order(config: PipelineConfig, samples: Sequence[Sample]) -> list[list[Sample]]:
    """The admitted samples of one regen shard in capture's forward batches (what its part files
    hold)."""
    keep, _ = admit(
        samples, max_seq_len=config.capture.max_seq_len, truncation=config.capture.truncation
    )
    plan = plan_batches([len(s.input_ids) for s in keep], config.capture.batch_tokens)
    return [[keep[i] for i in batch] for batch in plan]


def predicted_row_groups(
    config: PipelineConfig, parts: Sequence[Sequence[Sample]]
) -> list[list[Sample]]:
    """The row groups the feature shard of these capture parts gets (module docstring)."""
    capture = config.capture
    aux, last = column_codecs(
        capture.encoding, capture.dtype, config.target.hidden_size, topk=capture.topk
    )
    per_token = aux.bytes_per_token + last.bytes_per_token
    groups: list[list[Sample]] = []
    buffer: list[Sample] = []
    size = 0
    for part in parts:
        buffer += part
        size += _part_nbytes(part, per_token)
        if size >= capture.row_group_bytes:
            groups.append(buffer)
            buffer, size = [], 0
    if buffer:
        groups.append(buffer)
    return groups


def _row_group_ids(feature_shard: Path) -> list[list[str]]:
    """The sample ids of each row group of a feature shard (only that column is read)."""
    import pyarrow.parquet as pq

    file = pq.ParquetFile(feature_shard)
    return [
        file.read_row_group(rg, columns=["sample_id"]).column(0).to_pylist()
        for rg in range(file.num_row_groups)
    ]


class EpochPlanner:
    """``FeatureDataset``'s epoch planning (row groups shuffled from ``seed + epoch``, dealt to
    ranks by rows, rows shuffled inside each group, the common step count), over given row groups:
    the same methods, not a copy."""

    assignment = FeatureDataset.assignment
    _rank_batches = FeatureDataset._rank_batches
    _packs = FeatureDataset._packs
    plan = FeatureDataset.plan

    def __init__(
        self,
        groups: list[RowGroup],
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        shuffle: bool = True,
        max_seq_len: int | None = None,
    ) -> None:
        self.groups, self.batch_size, self.rank, self.world_size = (
            groups,
            batch_size,
            rank,
            world_size,
        )
        self.seed, self.shuffle, self.pack, self.max_seq_len = seed, shuffle, False, max_seq_len
        self._plans: dict[int, list] = {}


@dataclass
class OnlinePlan:
    """Every epoch's batches for every rank, over the predicted row groups of ``regen_dir``'s
    shards."""

    config: PipelineConfig
    groups: list[list[Sample]]  # row groups, shard order: predicted, or a stored shard's own
    world_size: int
    features_fp: str  # the features stage these batches stand in for (checked on every batch)
    # group -> (feature shard, its row group)
    stored: dict[int, tuple[Path, int]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        config: PipelineConfig,
        regen_dir: Path,
        *,
        world_size: int,
        stored_shards: dict[int, Path] | None = None,
    ) -> OnlinePlan:
        """The plan over ``regen_dir``'s shards. ``stored_shards`` (regen shard index -> its
        finished feature shard, e.g. from earlier stored nights): those shards' rows are read from
        their row groups, not captured."""
        shards = regen_shards(regen_dir)
        if not shards:
            raise FileNotFoundError(
                f"{regen_dir}: no regen shards to train on online; run `eagle3 regen` first"
            )
        groups: list[list[Sample]] = []
        stored: dict[int, tuple[Path, int]] = {}
        for path in shards:
            parts = capture_order(config, read_regen_shard(path))
            feature = (stored_shards or {}).get(shard_index_of(path))
            if feature is None:
                groups += predicted_row_groups(config, parts)
                continue
            by_id = {s.sample_id: s for part in parts for s in part}
            for row_group, ids in enumerate(_row_group_ids(feature)):
                stored[len(groups)] = (Path(feature), row_group)
                groups.append([by_id[i] for i in ids])
        fp = features_fingerprint(config, Path(regen_dir).name)
        return cls(
            config=config, groups=groups, world_size=world_size, features_fp=fp, stored=stored
        )

    @classmethod
    def for_night(cls, config: PipelineConfig, regen_dir: Path, *, world_size: int) -> OnlinePlan:
        """The plan every party of an online run builds (trainer ranks, producers, vocab): the
        feature shards a finished features stage of this config already holds (earlier stored
        nights) are read, the rest captured."""
        from eagle3.capture.manifest import feature_shards
        from eagle3.rundir.layout import shard_index, stage_dir
        from eagle3.rundir.runroot import Manifest

        features = stage_dir(
            config.root_path, "capture", features_fingerprint(config, Path(regen_dir).name)
        )
        stored = {}
        if Manifest.read(features) is not None:
            stored = {shard_index(p): p for p in feature_shards(features)}
        return cls.build(config, regen_dir, world_size=world_size, stored_shards=stored)

    def stored_rows(self, index: int) -> list[tuple[Path, int, int] | None]:
        """Per sample of batch ``index``: (feature shard, row group, row) when it is read from a
        stored shard."""
        epoch, step, rank = self.position(index)
        batch = self._planners[rank].plan(epoch)[step]
        out: list[tuple[Path, int, int] | None] = []
        for seq in batch:
            for g, r in seq:
                out.append((*self.stored[g], r) if g in self.stored else None)
        return out

    def planner(self, rank: int) -> EpochPlanner:
        train = self.config.train
        row_groups = [
            RowGroup(i, 0, tuple(len(s.input_ids) for s in g)) for i, g in enumerate(self.groups)
        ]
        return EpochPlanner(
            row_groups,
            batch_size=train.batch_size,
            rank=rank,
            world_size=self.world_size,
            seed=train.seed,
            max_seq_len=train.max_seq_len,
        )

    def __post_init__(self) -> None:
        self._planners = [self.planner(r) for r in range(self.world_size)]

    @property
    def steps_per_epoch(self) -> int:
        return len(self._planners[0].plan(0))

    @property
    def epochs(self) -> int:
        """Epochs the trainer runs: ``train.epochs``, or enough for ``train.max_steps``."""
        train = self.config.train
        if train.max_steps is None:
            return train.epochs
        return -(-train.max_steps // self.steps_per_epoch)

    @property
    def total_batches(self) -> int:
        return self.epochs * self.steps_per_epoch * self.world_size

    def index(self, epoch: int, step: int, rank: int) -> int:
        return (epoch * self.steps_per_epoch + step) * self.world_size + rank

    def position(self, index: int) -> tuple[int, int, int]:
        """(epoch, step, rank) of a global batch index."""
        rank = index % self.world_size
        epoch, step = divmod(index // self.world_size, self.steps_per_epoch)
        return epoch, step, rank

    def samples(self, index: int) -> list[Sample]:
        """The samples of batch ``index``, in batch row order."""
        epoch, step, rank = self.position(index)
        batch = self._planners[rank].plan(epoch)[step]
        return [self.groups[g][r] for seq in batch for g, r in seq]

    def key(self, index: int) -> Key:
        epoch, step, rank = self.position(index)
        return epoch, step, rank, tuple(s.sample_id for s in self.samples(index))

    def fingerprint(self) -> str:
        """What a trainer's position means: the groups' sample ids, the planning settings, the
        features."""
        digest = hashlib.sha256()
        for g in self.groups:
            digest.update("\0".join(s.sample_id for s in g).encode())
            digest.update(b"\1")
        train = self.config.train
        return fingerprint(
            "online-plan",
            digest.hexdigest(),
            train.seed,
            train.batch_size,
            self.world_size,
            train.max_seq_len,
            self.features_fp,
        )
