"""The feature loader: batch contract, zero-copy views, disjoint covering ranks, exact resume."""

from __future__ import annotations

import os
import random
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow.parquet as pq
import pytest
import torch

from eagle3.capture.encoding import TopKCodec, column_codecs, encoding_topk
from eagle3.capture.schema import FEATURE_SCHEMA, feature_table, footer_metadata
from eagle3.data.parquet import ShardWriter
from eagle3.train.data import FeatureDataset
from eagle3.train.feature_reader import iter_row_groups, open_features, read_row_group

H = 8
K = 4  # k of the fp8_topk shards


def _states(k: int, n: int) -> torch.Tensor:
    return torch.arange(n * 3 * H, dtype=torch.float32).view(n, 3 * H) / 64 + k


def _topk(k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of sample k: distinct ids from 70000 + k (beyond 16 bits), probabilities 2**-(j+1)
    (exact float16)."""
    ids = torch.arange(n * K).view(n, K) + 70_000 + k
    return ids, (0.5 ** torch.arange(1, K + 1, dtype=torch.float32)).expand(n, K)


def _write_shards(
    out_dir, *, n_shards=3, rows=20, dtype="bfloat16", rows_per_group=4, seed=0, encoding="raw"
):
    """Feature shards whose sample k has input_ids k, k+1, ... and states that encode k (row groups
    of ``rows_per_group`` rows)."""
    rng = random.Random(seed)
    aux_codec, last_codec = column_codecs(encoding, dtype, H, topk=K)
    meta = footer_metadata(
        target_model="t",
        target_revision=None,
        hidden_size=H,
        num_layers=8,
        layer_ids=[2, 4, 5],
        dtype=dtype,
        encoding=encoding,
        chat_template_hash="x",
        system_prompt_policy="keep",
        truncation="quarantine",
        max_seq_len=64,
        features_fingerprint="fp",
        topk=encoding_topk(encoding, K),
    )
    paths, k = [], 0
    for s in range(n_shards):
        table_rows = []
        for _ in range(rows):
            n = rng.randint(3, 12)
            aux = _states(k, n)
            last = (
                last_codec.encode(*_topk(k, n))
                if isinstance(last_codec, TopKCodec)
                else last_codec.encode(aux[:, :H])
            )
            table_rows.append(
                {
                    "sample_id": f"s{k}",
                    "input_ids": list(range(k, k + n)),
                    "loss_mask": [i % 2 for i in range(n)],
                    "seq_len": n,
                    "aux_hidden": aux_codec.encode(aux),
                    "last_hidden": last,
                }
            )
            k += 1
        with ShardWriter(
            out_dir, FEATURE_SCHEMA, start_index=s, row_group_bytes=1, metadata=meta
        ) as writer:
            # row_group_bytes=1: every write is one row group
            for at in range(0, rows, rows_per_group):
                writer.write_table(feature_table(table_rows[at : at + rows_per_group]))
            paths += [i.path for i in writer.close()]
    return paths


def _ids(batch) -> list[int]:
    return [int(row[0]) for row in batch["input_ids"]]


@pytest.mark.parametrize(
    ("encoding", "tolerance"),
    [("raw", 0.0), ("fp8_aux", 0.07), ("fp8_all", 0.07), ("fp8_topk", 0.07)],
)
def test_batches_follow_the_training_contract(tmp_path, encoding, tolerance):
    """Every encoding decodes to the same contract; fp8 (3 mantissa bits: 1/16 rounding, then bf16)
    within 7%; fp8_topk carries the stored top-k (exact) instead of the final state. Every batch of
    the epoch is checked, one staged at a time (``prefetch=0``): later batches reuse memory freed by
    earlier ones, so unwritten padding shows their states."""
    paths = _write_shards(tmp_path, n_shards=1, rows=10, encoding=encoding)
    for batch in FeatureDataset(paths, batch_size=2, shuffle=False, prefetch=0):
        _check_batch(batch, encoding, tolerance)


def _check_batch(batch, encoding, tolerance):
    b, t = batch["input_ids"].shape
    assert b == 2 and batch["input_ids"].dtype == torch.int64
    assert batch["attention_mask"].dtype == torch.bool and batch["loss_mask"].shape == (b, t)
    assert (
        batch["aux_hidden"].shape == (b, t, 3 * H) and batch["aux_hidden"].dtype == torch.bfloat16
    )
    topk = encoding == "fp8_topk"
    if topk:
        assert "last_hidden" not in batch and batch["target_ids"].shape == batch[
            "target_probs"
        ].shape == (b, t, K)
    else:
        assert batch["last_hidden"].shape == (b, t, H)
    for i, k in enumerate(_ids(batch)):
        n = int(batch["attention_mask"][i].sum())
        # right padding
        assert batch["attention_mask"][i, :n].all() and not batch["attention_mask"][i, n:].any()
        assert batch["input_ids"][i, :n].tolist() == list(range(k, k + n))
        expected = _states(k, n).bfloat16().float()
        assert torch.allclose(batch["aux_hidden"][i, :n].float(), expected, rtol=tolerance, atol=0)
        assert not batch["aux_hidden"][i, n:].any()
        if topk:
            ids, probs = _topk(k, n)
            assert torch.equal(batch["target_ids"][i, :n], ids) and torch.equal(
                batch["target_probs"][i, :n], probs
            )
            # padding
            assert not batch["target_ids"][i, n:].any() and not batch["target_probs"][i, n:].any()
            continue
        last = batch["last_hidden"][i, :n].float()
        assert torch.allclose(
            last, expected[:, :H], rtol=tolerance if encoding == "fp8_all" else 0, atol=0
        )
        assert not batch["last_hidden"][i, n:].any()


def test_binary_columns_become_views_of_the_arrow_buffer(tmp_path):
    (path,) = _write_shards(tmp_path, n_shards=1, rows=4, dtype="float32")
    column = pq.read_table(path, columns=["aux_hidden"]).column(0)
    tensors = [v for v, _ in column_codecs("raw", "float32", H)[0].views(column)]
    chunk = column.chunks[0]
    data = chunk.buffers()[2]
    first = memoryview(chunk.buffers()[1]).cast("i")[chunk.offset]
    # no copy: the tensor points into Arrow's buffer
    assert tensors[0].data_ptr() == data.address + first


def test_ranks_get_disjoint_row_groups_that_cover_everything(tmp_path):
    paths = _write_shards(tmp_path, n_shards=3, rows=20)
    ds = FeatureDataset(paths, batch_size=2, world_size=3)
    for epoch in (0, 1):
        ranks = ds.assignment(epoch)
        flat = [g for r in ranks for g in r]
        assert sorted(flat) == list(range(len(ds.groups)))  # disjoint and covering
        rows = [sum(len(ds.groups[g].lengths) for g in r) for r in ranks]
        # balanced within one row group
        assert max(rows) - min(rows) <= max(len(g.lengths) for g in ds.groups)
    seen: list[int] = []
    steps = set()
    for rank in range(3):
        part = FeatureDataset(paths, batch_size=2, rank=rank, world_size=3)
        batches = list(part)
        steps.add(len(batches))
        seen += [k for b in batches for k in _ids(b)]
    assert len(steps) == 1  # every rank takes the same number of steps
    # 60 rows in 15 equal row groups: all covered once
    assert len(seen) == len(set(seen)) and len(seen) == 60


def test_unbalanced_row_groups_still_give_equal_steps(tmp_path):
    paths = _write_shards(tmp_path, n_shards=1, rows=23, rows_per_group=5)
    counts = {
        len(list(FeatureDataset(paths, batch_size=2, rank=r, world_size=2))) for r in range(2)
    }
    assert len(counts) == 1


@pytest.mark.parametrize("prefetch", [0, 2], ids=["collated-when-asked", "collated-ahead"])
@pytest.mark.parametrize("encoding", ["raw", "fp8_aux", "fp8_all", "fp8_topk"])
def test_resume_position_gives_the_exact_remaining_batches(tmp_path, encoding, prefetch):
    """The position is encoding-independent: a resumed loader (as after a kill -9 of training) hands
    out exactly the batches an uninterrupted one would, prefetched batches included (a GPU
    consumer's collating thread)."""
    paths = _write_shards(tmp_path, n_shards=2, rows=15, encoding=encoding)
    reference = FeatureDataset(paths, batch_size=3, rank=1, world_size=2, seed=7)
    epoch0 = list(reference)
    epoch1 = list(reference)
    assert _ids(epoch0[0]) != _ids(epoch1[0]) or len(epoch0) == 1  # a new order each epoch
    ds = FeatureDataset(paths, batch_size=3, rank=1, world_size=2, seed=7, prefetch=prefetch)
    it = iter(ds)
    for _ in range(2):
        next(it)
    state = ds.state_dict()
    assert state["epoch"] == 0 and state["step"] == 2
    resumed = FeatureDataset(paths, batch_size=3, rank=1, world_size=2, seed=7)
    resumed.load_state_dict(state)
    rest = list(resumed) + list(resumed)
    for got, want in zip(rest, epoch0[2:] + epoch1, strict=True):
        for key in want:
            assert torch.equal(got[key], want[key]), key


@pytest.mark.gpu
@pytest.mark.parametrize("encoding", ["raw", "fp8_aux", "fp8_all", "fp8_topk"])
def test_a_gpu_consumer_gets_the_cpu_consumers_batches_decoded_on_the_gpu(tmp_path, encoding):
    """On CUDA the batch is staged in its stored form on the collating thread, copied, and decoded
    on the GPU; it must equal what a CPU consumer gets, batch for batch (the decode is exact integer
    and float32 arithmetic on both)."""
    paths = _write_shards(tmp_path, n_shards=2, rows=15, encoding=encoding)
    make = lambda device: FeatureDataset(  # noqa: E731
        paths,
        batch_size=3,
        seed=3,
        hidden_dtype=torch.float32,
        device=device,
    )
    on_gpu = make("cuda")
    assert on_gpu.prefetch == 2  # the GPU default: collated ahead on a thread
    for got, want in zip(list(on_gpu), list(make("cpu")), strict=True):
        assert got.keys() == want.keys()
        for key, value in got.items():
            assert value.device.type == "cuda", key
            assert torch.equal(value.cpu(), want[key]), key


def test_resume_refuses_another_plan(tmp_path):
    paths = _write_shards(tmp_path, n_shards=2, rows=8)
    state = FeatureDataset(paths, batch_size=2, seed=1).state_dict()
    with pytest.raises(ValueError, match="other data or settings"):
        FeatureDataset(paths, batch_size=4, seed=1).load_state_dict(state)


def test_packing_fills_sequences_and_restarts_positions(tmp_path):
    paths = _write_shards(tmp_path, n_shards=1, rows=12)
    ds = FeatureDataset(
        paths, batch_size=2, max_seq_len=24, pack=True, shuffle=False, hidden_dtype=torch.float32
    )
    total = 0
    for batch in ds:
        assert batch["input_ids"].shape[1] <= 24 and batch["aux_hidden"].dtype == torch.float32
        starts = (batch["position_ids"] == 0) & batch["attention_mask"]
        total += int(starts.sum())
        assert (batch["position_ids"][~batch["attention_mask"]] == 0).all()
    assert total == 12  # every row placed once


def test_max_seq_len_truncates_rows(tmp_path):
    paths = _write_shards(tmp_path, n_shards=1, rows=6)
    batch = next(iter(FeatureDataset(paths, batch_size=6, max_seq_len=3, shuffle=False)))
    assert batch["input_ids"].shape == (6, 3) and batch["attention_mask"].all()


def test_one_shard_read_from_many_threads_at_once_gives_every_row_group_intact(tmp_path):
    """The read-ahead threads and the collating thread read row groups of one shard at the same
    time; a shared pre-buffered ``pq.ParquetFile`` fails that way ("ReadRangeCache did not find
    matching cache entry", or a crash of the whole process: the night's gate died of SIGSEGV), so
    each read must use its own handle."""
    (path,) = _write_shards(tmp_path, n_shards=1, rows=48, rows_per_group=1)
    file, codecs = open_features(path), column_codecs("raw", "bfloat16", H)
    groups = range(file.num_row_groups)
    want = [[t.tolist() for t in read_row_group(file, rg, codecs).input_ids] for rg in groups]
    assert len(want) >= 24

    def read(rg: int) -> list[list[int]]:
        return [t.tolist() for t in read_row_group(file, rg, codecs).input_ids]

    with ThreadPoolExecutor(4) as pool:
        for _ in range(30):
            assert list(pool.map(read, groups)) == want


def test_row_groups_read_ahead_come_in_the_asked_order_and_equal_direct_reads(tmp_path):
    files = [open_features(p) for p in _write_shards(tmp_path, n_shards=4, rows=5)]
    codecs = column_codecs("raw", "bfloat16", H)
    reads = [(files[i], rg) for i in (2, 0, 3, 1) for rg in range(files[i].num_row_groups)]
    got = list(iter_row_groups(iter(reads), codecs, ahead=2))
    assert len(got) == len(reads) >= 4
    for (file, rg), decoded in zip(reads, got, strict=True):
        direct = read_row_group(file, rg, codecs)
        assert [t.tolist() for t in decoded.input_ids] == [t.tolist() for t in direct.input_ids]
        assert all(
            torch.equal(a, b) for (a, _), (b, _) in zip(decoded.aux, direct.aux, strict=True)
        )
    early = iter_row_groups(iter(reads), codecs)
    next(early)
    early.close()  # a consumer that stops early (end of training) does not wait on a dead read


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_a_cpu_consumer_gets_reads_from_lowest_priority_threads_and_collates_on_its_own(
    tmp_path, monkeypatch
):
    """A CPU training step keeps every core busy: the loader's reading threads must yield to it
    (nice 19, Arrow decoding on them, not on its own pool), and its batches are collated on its own
    thread, at its priority (the copies then run on torch's intra-op threads instead of taking a
    core from one of them)."""
    import eagle3.train.feature_reader as shards

    seen: list[tuple[int, bool, str, int]] = []
    read, collate = shards.read_row_group, FeatureDataset._collate

    def spy_read(*args, arrow_threads=True):
        seen.append(
            (os.getpriority(os.PRIO_PROCESS, 0), arrow_threads, "read", threading.get_ident())
        )
        return read(*args, arrow_threads=arrow_threads)

    def spy_collate(self, seqs):
        seen.append((os.getpriority(os.PRIO_PROCESS, 0), False, "collate", threading.get_ident()))
        return collate(self, seqs)

    monkeypatch.setattr(shards, "read_row_group", spy_read)
    monkeypatch.setattr(FeatureDataset, "_collate", spy_collate)
    mine, me = os.getpriority(os.PRIO_PROCESS, 0), threading.get_ident()
    batches = list(
        FeatureDataset(_write_shards(tmp_path), batch_size=4, hidden_dtype=torch.float32)
    )
    assert len(batches) == 15
    reads = [(nice, threads, thread) for nice, threads, kind, thread in seen if kind == "read"]
    collates = [(nice, thread) for nice, _, kind, thread in seen if kind == "collate"]
    assert reads and all(
        nice == 19 and not threads and thread != me for nice, threads, thread in reads
    )
    assert collates == [(mine, me)] * 15
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine
    seen.clear()
    for file, rg in [(open_features(p), 0) for p in _write_shards(tmp_path / "b")]:
        # not for a CPU step: Arrow's pool
        list(iter_row_groups([(file, rg)], column_codecs("raw", "bfloat16", H)))
    assert seen and all(nice == mine and threads for nice, threads, *_ in seen)
