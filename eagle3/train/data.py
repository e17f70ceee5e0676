"""The training loader: feature shards -> right-padded batch dicts, split over ranks, resumable
exactly.

Design choices:
* The unit of distribution is the Parquet row group (shards are written with byte-sized row groups,
  so row groups are similar in bytes). Each epoch the (shard, row group) list is shuffled from
  ``seed + epoch`` and dealt to ranks greedily by row count (largest deficit first), so ranks get
  disjoint sets that together cover every row group and hold about the same number of rows. Rows are
  shuffled inside each row group, so a row group is read once per epoch and stays hot while its rows
  are consumed.
* Every rank must take the same number of steps (DDP all-reduces each step): batches per epoch are
  the minimum over ranks (every rank can compute every rank's plan from the row counts in the
  footers, without reading data); a rank's surplus tail (less than one row group) is skipped that
  epoch and, being reshuffled, used in others.
* The plan of an epoch is a pure function of (shards, row counts, seed, epoch, rank, world size,
  batch size, packing), so the position ``(epoch, step)`` resumes exactly; ``state_dict`` also
  reports the row group index and row the next batch starts at, plus a plan fingerprint that refuses
  to resume on different data.
* Hidden states become tensors without an extra copy: ``torch.frombuffer`` over the decompressed
  Arrow buffers (``eagle3.capture.encoding``: raw bf16 is stored as int16 and reinterpreted; fp8
  values and their per-token scales are two views of one value). The one copy is into the padded
  batch tensors, kept in the stored form (bf16, fp8 + scales) and decoded to ``hidden_dtype`` on
  ``device`` (the GPU when training there), except raw states for a CPU consumer, converted during
  the copy.
* Row groups are read and decompressed on background threads, the next one ahead of the one in use
  (Arrow's decompression releases the GIL), so the training step does not wait for the disk. A GPU
  consumer gets its batches collated on one more thread, ``prefetch`` batches ahead: its step leaves
  the CPU free. That thread stages them in pinned memory, copies and decodes them on a CUDA stream
  of its own (overlapping the step's kernels), and the consumer's stream waits for that work when it
  takes the batch. When the consumer computes on this CPU (``device="cpu"``) the reading threads run
  at the lowest CPU priority and Arrow decodes on them rather than on its own pool, so they fill the
  gaps of a step that keeps every core busy instead of preempting its intra-op threads
  (``eagle3.runtime.procs.yield_cpu``); and the batch is collated on the consumer's own thread when
  it asks for it: the copies then run on torch's intra-op threads, where a collating thread took a
  core from one of them and left the other waiting (BENCHMARKS.md, "Loader").
* ``pack=True`` concatenates rows into sequences of up to ``max_seq_len`` tokens and adds
  ``position_ids`` (restarting at 0 for each row) so the consumer can keep attention inside each
  row.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from eagle3.capture.encoding import (
    FP8,
    TOPK_ID_DTYPE,
    TOPK_PROB_DTYPE,
    TORCH_DTYPES,
    ColumnCodec,
    FinalCodec,
    TopKCodec,
    dequantize,
)
from eagle3.capture.schema import check_footer, footer_codecs
from eagle3.rundir.integrity import ALONE, Share, verify_files
from eagle3.rundir.runroot import fingerprint
from eagle3.runtime.transfer import DeviceTransfer, Moved
from eagle3.train.distributed import gather_lines
from eagle3.train.feature_reader import (
    Decoded,
    FeatureFile,
    iter_row_groups,
    open_features,
    read_row_group,
    run_ahead,
)

logger = logging.getLogger(__name__)

Item = tuple[int, int]  # (index into this dataset's row-group list, row inside it)
Batch = list[list[Item]]  # batch rows, each a sequence of items (one item unless packing)
# a state column's padded buffers: values, scales (or probs)
Staged = tuple[torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class RowGroup:
    shard: int
    row_group: int
    lengths: tuple[int, ...]
    # the rows (inside the group) trained on, when ``rows`` filters; None: all
    keep: tuple[int, ...] | None = None

    @property
    def n(self) -> int:
        return len(self.lengths) if self.keep is None else len(self.keep)


def _resolve(shards: Path | str | Sequence[Path | str]) -> list[Path]:
    if isinstance(shards, (str, Path)) and Path(shards).is_dir():
        from eagle3.capture.manifest import feature_shards

        return feature_shards(Path(shards))
    if isinstance(shards, (str, Path)):
        return [Path(shards)]
    return [Path(p) for p in shards]


def _verify_share(rank: int, world_size: int) -> Share:
    """A loader built as this process's rank of its process group (the trainer builds one on every
    rank) hashes its share of the shards and learns the others' problems by an all-gather; any other
    (one process, or one playing a rank of another world size, as tests and benchmarks do) hashes
    every shard."""
    if dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) == (rank, world_size):
        return Share(rank, world_size, gather_lines)
    return ALONE


class FeatureDataset(IterableDataset):
    """Batches of ``input_ids [B,T] int64, loss_mask [B,T] bool, attention_mask [B,T] bool,
    aux_hidden [B,T,3H], last_hidden [B,T,H]`` (right padding) from feature shards; one pass of
    ``__iter__`` is one epoch. Features in the ``fp8_topk`` encoding carry ``target_ids [B,T,k]
    int64, target_probs [B,T,k] float32`` (padding: id 0, probability 0) instead of ``last_hidden``.

    ``shards`` is a finished features directory (its manifest lists the shards) or shard paths.
    ``hidden_dtype`` None keeps the stored dtype (footer ``dtype``); batches come out on ``device``.
    ``prefetch``: batches a collating thread prepares ahead of the consumer; 0 collates on the
    consumer's thread when it asks. None: 0 for a CPU consumer (its step keeps every core busy), 2
    for a GPU one (module docstring). ``rows``: the rows to train on, as shard file name -> row
    indices in that file (a night that builds on the champion, ``eagle3.train.continual``); shards
    it does not name are skipped. None: every row."""

    def __init__(
        self,
        shards: Path | str | Sequence[Path | str],
        *,
        batch_size: int = 1,
        rank: int = 0,
        world_size: int = 1,
        max_seq_len: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        pack: bool = False,
        hidden_dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
        prefetch: int | None = None,
        rows: dict[str, Sequence[int]] | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if pack and max_seq_len is None:
            raise ValueError("pack=True needs max_seq_len (the packed sequence length)")
        self.paths = _resolve(shards)
        # before any byte is trained on (eagle3.rundir.integrity): sizes and footers here (the ranks
        # of a process group split them), each page as it is read (``FeatureFile.read``)
        verify_files(
            self.paths,
            rebuild="eagle3 capture",
            share=_verify_share(rank, world_size),
            pages_checked=True,
        )
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        self.max_seq_len, self.seed, self.shuffle, self.pack = max_seq_len, seed, shuffle, pack
        self.rows = None if rows is None else {name: frozenset(ids) for name, ids in rows.items()}
        self._files: list[FeatureFile] = []
        self.groups: list[RowGroup] = []
        self.dtype, self.hidden_size, (self.aux_codec, self.last_codec) = self._scan()
        self.hidden_dtype = hidden_dtype or TORCH_DTYPES[self.dtype]
        self._transfer = DeviceTransfer(device)
        self.device = self._transfer.device
        # the consumer computes on this CPU: reads yield to it
        self._background = self.device.type == "cpu"
        self.prefetch = (0 if self._background else 2) if prefetch is None else prefetch
        if self.prefetch < 0:
            raise ValueError(
                f"prefetch={prefetch} must be >= 0 (0 collates on the consumer's thread)"
            )
        self.epoch, self.step = 0, 0
        self._plans: dict[int, list[Batch]] = {}
        self._cache: OrderedDict[int, Decoded] = OrderedDict()
        # this epoch's row groups, read ahead (``iter_row_groups``)
        self._reads: Iterator[Decoded] | None = None
        self._read_order: list[int] = []
        self._next_read = 0
        self._last: Batch = []  # the batch yielded last, for ``origin``
        self._plan_fp = fingerprint(
            [str(p) for p in self.paths],
            [g.lengths for g in self.groups],
            seed,
            shuffle,
            rank,
            world_size,
            batch_size,
            pack,
            max_seq_len,
            *([] if rows is None else [sorted((k, sorted(v)) for k, v in rows.items())]),
        )

    def _scan(self) -> tuple[str, int, tuple[ColumnCodec, FinalCodec]]:
        """Open every shard (footer + schema validated), read row counts and lengths per row
        group."""
        dtypes, hidden, codecs = set(), set(), set()
        for s, path in enumerate(self.paths):
            file = open_features(path)
            meta = {
                k.decode(): v.decode()
                for k, v in (file.metadata.metadata or {}).items()
                if k != b"ARROW:schema"
            }
            check_footer(meta, path=path)
            dtypes.add(meta["dtype"])
            hidden.add(int(meta["hidden_size"]))
            codecs.add(footer_codecs(meta))
            self._files.append(file)
            lengths = file.read(["seq_len"]).column(0).to_pylist()  # one read, not one per group
            start = 0
            for rg in range(file.num_row_groups):
                rows = file.metadata.row_group(rg).num_rows
                keep = self._kept(path, start, rows)
                if rows and (keep is None or keep):
                    self.groups.append(RowGroup(s, rg, tuple(lengths[start : start + rows]), keep))
                start += rows
        if len(dtypes) > 1 or len(hidden) > 1 or len(codecs) > 1:
            raise ValueError(
                f"feature shards mix dtypes {sorted(dtypes)} / hidden sizes {sorted(hidden)} / "
                "encodings; train on shards of one capture stage"
            )
        if not self.groups:
            raise ValueError(f"no rows in feature shards {[str(p) for p in self.paths]}")
        return dtypes.pop(), hidden.pop(), codecs.pop()

    def _kept(self, path: Path, start: int, rows: int) -> tuple[int, ...] | None:
        """The rows of a row group starting at file row ``start`` that ``rows`` keeps (None: no
        filter)."""
        if self.rows is None:
            return None
        wanted = self.rows.get(path.name, frozenset())
        return tuple(r for r in range(rows) if start + r in wanted)

    # ---- the plan
    # -------------------------------------------------------------------------------------------

    def assignment(self, epoch: int) -> list[list[int]]:
        """Row-group indices of each rank for ``epoch``, in that rank's reading order (disjoint,
        covering)."""
        order = list(range(len(self.groups)))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(order)).tolist()
        ranks: list[list[int]] = [[] for _ in range(self.world_size)]
        rows = [0] * self.world_size
        for g in order:
            r = min(range(self.world_size), key=lambda i: (rows[i], i))
            ranks[r].append(g)
            rows[r] += self.groups[g].n
        return ranks

    def _rank_batches(self, epoch: int, groups: list[int]) -> list[Batch]:
        items: list[Item] = []
        for g in groups:
            group = self.groups[g]
            rows = (
                np.random.default_rng([self.seed, epoch, g]).permutation(group.n).tolist()
                if self.shuffle
                else range(group.n)
            )
            items += [(g, r if group.keep is None else group.keep[r]) for r in rows]
        seqs = self._packs(items) if self.pack else [[item] for item in items]
        return [seqs[i : i + self.batch_size] for i in range(0, len(seqs), self.batch_size)]

    def _packs(self, items: list[Item]) -> list[list[Item]]:
        """Greedy in-order packing into sequences of at most ``max_seq_len`` tokens (rows cut to
        that length)."""
        assert self.max_seq_len is not None
        packs: list[list[Item]] = []
        used = self.max_seq_len + 1
        for g, r in items:
            n = min(self.groups[g].lengths[r], self.max_seq_len)
            if used + n > self.max_seq_len:
                packs.append([])
                used = 0
            packs[-1].append((g, r))
            used += n
        return packs

    def plan(self, epoch: int) -> list[Batch]:
        """This rank's batches for ``epoch``: the same count on every rank (the shortest rank's
        count)."""
        if epoch not in self._plans:
            per_rank = [self._rank_batches(epoch, groups) for groups in self.assignment(epoch)]
            steps = min(len(b) for b in per_rank)
            mine = per_rank[self.rank]
            if len(mine) > steps:
                logger.debug(
                    "rank %d epoch %d: skipping %d batches beyond the common step count %d",
                    self.rank,
                    epoch,
                    len(mine) - steps,
                    steps,
                )
            # keep one epoch's plan: they are cheap to recompute
            self._plans = {epoch: mine[:steps]}
        return self._plans[epoch]

    def __len__(self) -> int:
        return len(self.plan(self.epoch))

    # ---- reading
    # --------------------------------------------------------------------------------------------

    def _decoded(self, g: int) -> Decoded:
        if g in self._cache:
            self._cache.move_to_end(g)
            return self._cache[g]
        group = self.groups[g]
        if self._reads is not None and self._read_order[self._next_read : self._next_read + 1] == [
            g
        ]:
            decoded, self._next_read = next(self._reads), self._next_read + 1
        else:  # not the epoch's next row group (never the case while iterating): read it alone
            decoded = read_row_group(
                self._files[group.shard],
                group.row_group,
                (self.aux_codec, self.last_codec),
                arrow_threads=not self._background,
            )
        if len(decoded.aux) != len(group.lengths):
            raise ValueError(
                f"{self.paths[group.shard]} changed while training (row group {group.row_group})"
            )
        self._cache[g] = decoded
        while len(self._cache) > 2:
            self._cache.popitem(last=False)
        return decoded

    def _collate(self, seqs: Batch) -> Moved:
        limit = self.max_seq_len or max(self.groups[g].lengths[r] for seq in seqs for g, r in seq)
        width = max(sum(min(self.groups[g].lengths[r], limit) for g, r in seq) for seq in seqs)
        b, zeros = len(seqs), self._transfer.zeros
        out = {
            "input_ids": zeros(b, width, dtype=torch.int64),
            "loss_mask": zeros(b, width, dtype=torch.bool),
            "attention_mask": zeros(b, width, dtype=torch.bool),
        }
        aux, aux_scale = self._staged(self.aux_codec, b, width)
        last, last_scale = self._staged(self.last_codec, b, width)
        if self.pack:
            out["position_ids"] = zeros(b, width, dtype=torch.int64)
        for i, seq in enumerate(seqs):
            at = 0
            for g, r in seq:
                d = self._decoded(g)
                n = min(len(d.input_ids[r]), limit)
                out["input_ids"][i, at : at + n] = d.input_ids[r][:n]
                out["loss_mask"][i, at : at + n] = d.loss_mask[r][:n]
                out["attention_mask"][i, at : at + n] = True
                aux[i, at : at + n] = d.aux[r][0][:n]  # the one copy: into the padded batch
                last[i, at : at + n] = d.last[r][0][:n]
                if aux_scale is not None:
                    aux_scale[i, at : at + n] = d.aux[r][1][:n]
                if last_scale is not None:
                    last_scale[i, at : at + n] = d.last[r][1][:n]
                if self.pack:
                    out["position_ids"][i, at : at + n] = torch.arange(n)
                at += n
            # only the padding is zeroed, not the whole buffer
            for staged in (aux, aux_scale, last, last_scale):
                if staged is not None:
                    staged[i, at:] = 0
        return self._transfer.moved(
            lambda: self._on_device(out, (aux, aux_scale), (last, last_scale))
        )

    def _on_device(
        self, out: dict[str, torch.Tensor], aux: Staged, last: Staged
    ) -> dict[str, torch.Tensor]:
        """The staged batch copied to ``device`` in its stored form and decoded there
        (``eagle3.runtime.transfer``)."""
        copy = self._transfer.copy
        batch = {k: copy(v) for k, v in out.items()}
        batch["aux_hidden"] = self._decode(*aux)
        # (ids, probs) staged in the (values, scales) slots
        if isinstance(self.last_codec, TopKCodec):
            ids, probs = last
            batch["target_ids"], batch["target_probs"] = copy(ids).long(), copy(probs).float()
        else:
            batch["last_hidden"] = self._decode(*last)
        return batch

    def _staged(self, codec: FinalCodec, b: int, width: int) -> Staged:
        """Uninitialised padded buffers in the stored form (+ the fp8 scales, or the top-k's
        probabilities next to its ids), zeroed by ``_collate`` past each row's tokens only (zeroing
        whole buffers first cost ~1.3 ms of the reader's ~19 ms of CPU per batch); raw states for a
        CPU consumer are converted to ``hidden_dtype`` by the copy itself. Pinned for a GPU
        consumer."""
        empty = self._transfer.empty
        if isinstance(codec, TopKCodec):
            return empty(b, width, codec.k, dtype=TOPK_ID_DTYPE), empty(
                b, width, codec.k, dtype=TOPK_PROB_DTYPE
            )
        if codec.fp8:
            return empty(b, width, codec.width, dtype=FP8), empty(
                b, width, codec.segments, dtype=torch.float32
            )
        dtype = self.hidden_dtype if self.device.type == "cpu" else TORCH_DTYPES[codec.dtype]
        return empty(b, width, codec.width, dtype=dtype), None

    def _decode(self, values: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
        """Move the stored form to ``device`` and decode it there (fp8 padding has scale 0: it
        decodes to 0)."""
        values = self._transfer.copy(values)
        if scales is None:
            return values.to(self.hidden_dtype)
        return dequantize(values, self._transfer.copy(scales), self.hidden_dtype)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """One epoch from the current position, taking the row groups in the order the batches first
        use them from ``iter_row_groups`` (the next one already reading), the batches collated
        ``prefetch`` ahead on a thread (the position counts only the batches handed out, so a resume
        never skips a prefetched one) or, with ``prefetch=0``, on the consumer's thread when it
        asks."""
        batches = self.plan(self.epoch)
        self._cache.clear()
        self._read_order = list(
            dict.fromkeys(g for batch in batches[self.step :] for seq in batch for g, _ in seq)
        )
        self._next_read = 0
        self._reads = iter_row_groups(
            (
                (self._files[self.groups[g].shard], self.groups[g].row_group)
                for g in self._read_order
            ),
            (self.aux_codec, self.last_codec),
            background=self._background,
        )
        try:
            yield from self._batches(batches)
        finally:
            self._reads.close()
            self._reads = None

    def _batches(self, batches: list[Batch]) -> Iterator[dict[str, torch.Tensor]]:
        todo = batches[self.step :]
        collated = self._collated_ahead(todo) if self.prefetch else map(self._collate, todo)
        try:
            for batch in collated:
                self._last = batches[self.step]
                self.step += 1
                yield self._transfer.handed_out(batch)
        finally:
            if self.prefetch:
                collated.close()
        self.epoch, self.step = self.epoch + 1, 0

    def _collated_ahead(self, batches: list[Batch]) -> Generator[Moved, None, None]:
        """``batches`` collated on a thread of their own, ``prefetch`` ahead of the consumer."""
        return run_ahead(
            self._collate,
            batches,
            ahead=self.prefetch,
            threads=1,
            name="feature-reader",
            background=self._background,
        )

    def origin(self) -> str:
        """Where the batch yielded last came from: shard paths and sample ids (read only when asked,
        on a failure)."""
        where: dict[Path, list[str]] = {}
        for seq in self._last:
            for g, r in seq:
                group = self.groups[g]
                ids = self._files[group.shard].read_column(group.row_group, "sample_id")
                where.setdefault(self.paths[group.shard], []).append(str(ids[r]))
        return "; ".join(f"{path} samples {ids}" for path, ids in where.items()) or "no batch yet"

    # ---- position
    # -------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Position of the next batch: ``epoch``, ``step``, and where it starts (``row_group`` index
        into this rank's row-group order, ``row`` inside it), plus a fingerprint of the plan's
        inputs."""
        batches = self.plan(self.epoch)
        group_pos, row = 0, 0
        if self.step < len(batches):
            g, row = batches[self.step][0][0]
            group_pos = self.assignment(self.epoch)[self.rank].index(g)
        return {
            "epoch": self.epoch,
            "step": self.step,
            "row_group": group_pos,
            "row": row,
            "plan_fingerprint": self._plan_fp,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("plan_fingerprint") not in (None, self._plan_fp):
            raise ValueError(
                "loader state was saved for other data or settings (shards, seed, ranks, batch size); resume with "
                f"the same features and train config, or start a new run: {json.dumps(state)}"
            )
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self._cache.clear()
