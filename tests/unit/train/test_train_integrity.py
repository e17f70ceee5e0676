"""Damaged data never trains silently: shards are checked against their manifest before the first
batch (sizes and footers; each page by its checksum as it is read), a non-finite step stops training
naming the batch's shard and samples, and export refuses non-finite weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file, save_file
from train_synthetic import H, synthetic

from eagle3.capture.encoding import column_codecs
from eagle3.capture.schema import FEATURE_SCHEMA, feature_table, footer_metadata
from eagle3.data.parquet import ShardWriter
from eagle3.errors import DATA_ERROR_EXIT, DATA_ERROR_PREFIX, DataError
from eagle3.rundir.runroot import FileEntry, Manifest
from eagle3.train.checkpoint import latest_checkpoint
from eagle3.train.data import FeatureDataset
from eagle3.train.distributed import DistInfo
from eagle3.train.trainer import NonFiniteStep, train_on_source
from eagle3.worlds.distil import ListBatchSource

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def _features(
    out: Path,
    *,
    rows: int = 8,
    nan_row: int | None = None,
    with_manifest: bool = True,
    rows_per_shard: int | None = None,
    footers: bool = True,
) -> Path:
    """A finished features directory of float32 shards (hidden size H; one, or ``rows_per_shard``
    rows each, one row group each): the first shard's path; row ``nan_row`` has a NaN state.
    ``footers``: listed with their footer hashes, as capture lists them; else as an older night's
    shards (whole-file sha256 only)."""
    meta = footer_metadata(
        target_model="t",
        target_revision=None,
        hidden_size=H,
        num_layers=8,
        layer_ids=[2, 4, 5],
        dtype="float32",
        encoding="raw",
        chat_template_hash="x",
        system_prompt_policy="keep",
        truncation="quarantine",
        max_seq_len=64,
        features_fingerprint=out.name,
    )
    aux_codec, last_codec = column_codecs("raw", "float32", H)
    g = torch.Generator().manual_seed(0)
    table = []
    for k in range(rows):
        aux = torch.randn(10, 3 * H, generator=g)
        if k == nan_row:
            aux[3, 5] = float("nan")
        table.append(
            {
                "sample_id": f"s{k}",
                "input_ids": torch.randint(0, 64, (10,), generator=g).tolist(),
                "loss_mask": [1] * 10,
                "seq_len": 10,
                "aux_hidden": aux_codec.encode(aux),
                "last_hidden": last_codec.encode(torch.randn(10, H, generator=g)),
            }
        )
    with ShardWriter(
        out, FEATURE_SCHEMA, metadata=meta, rows_per_shard=rows_per_shard or rows
    ) as writer:
        writer.write_table(feature_table(table))
        infos = writer.close()
    if with_manifest:
        files = [
            FileEntry.of(
                i.path, rows=i.rows, base=out, footer_sha256=i.footer_sha256 if footers else None
            )
            for i in infos
        ]
        Manifest("features", out.name, files=files).write(out)
    return infos[0].path


def _damage_hidden_states(path: Path) -> None:
    """Overwrite 64 bytes inside the aux_hidden column chunk; the footer stays intact (the issue's
    experiment)."""
    column = (
        pq.ParquetFile(path).metadata.row_group(0).column(FEATURE_SCHEMA.names.index("aux_hidden"))
    )
    at = (
        column.dictionary_page_offset or column.data_page_offset
    ) + column.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[at : at + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))


def test_a_damaged_page_is_refused_as_it_is_read_naming_the_shard_and_no_batch_holds_its_rows(
    tmp_path, record_hashes
):
    """At Kimi-K2.5's scale a whole-file pass before training reads ~3 TB: the loader hashes only
    footers, then checks each page as it reads it. The shards before the damaged one train; none of
    its rows reach a batch."""
    import eagle3.rundir.integrity as integrity

    first = _features(tmp_path / "features" / "fp", rows=8, rows_per_shard=2)
    damaged = sorted(first.parent.glob("shard-*.parquet"))[2]
    _damage_hidden_states(damaged)
    pq.ParquetFile(damaged)  # the footer alone still reads
    hashed = record_hashes(integrity)
    loader = FeatureDataset(first.parent, batch_size=2, shuffle=False)
    assert hashed == []  # no shard was read whole before training
    batches = []
    with pytest.raises(
        DataError, match=rf"{damaged} row group 0: does not read back \(.*CRC.*eagle3 capture"
    ):
        for batch in loader:
            batches.append(batch)
    assert len(batches) == 2  # shards 0 and 1, one batch each: nothing of shard 2


def test_a_shard_listed_without_a_footer_hash_is_hashed_whole_and_refused_before_the_first_batch(
    tmp_path,
):
    shard = _features(tmp_path / "features" / "fp", footers=False)  # an older night's entry
    FeatureDataset(shard.parent, batch_size=2)  # intact: verified and opened
    _damage_hidden_states(shard)
    with pytest.raises(DataError, match=rf"{shard}: sha256 differs.*eagle3 capture"):
        FeatureDataset(shard.parent, batch_size=2)


def test_a_damaged_footer_is_refused_before_the_first_batch(tmp_path):
    shard = _features(tmp_path / "features" / "fp")
    data = bytearray(shard.read_bytes())
    data[-20] ^= 0x01  # inside the footer's metadata: no page checksum covers it
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"{shard}: the footer's sha256 differs.*eagle3 capture"):
        FeatureDataset(shard.parent, batch_size=2)


def test_truncated_feature_shard_is_refused_with_its_size(tmp_path):
    shard = _features(tmp_path / "features" / "fp")
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(DataError, match=rf"{shard}: \d+ bytes, the manifest says \d+"):
        FeatureDataset(shard.parent, batch_size=2)


def _verifying_rank(rank: int, world: int, port: int, features: str, out: str) -> None:
    """A gloo rank that builds the loader over ``features`` twice, recording the shards it hashed:
    intact, then after rank 1 damaged one of its own share (its report: ``out/rank-R.json``)."""
    import json

    import torch.distributed as dist

    import eagle3.rundir.integrity as integrity
    from eagle3.train.distributed import cleanup_distributed, init_distributed

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    hashed: list[str] = []
    sha256 = integrity.sha256_file
    integrity.sha256_file = lambda path: hashed.append(Path(path).name) or sha256(path)
    init_distributed("cpu")
    try:
        FeatureDataset(features, batch_size=2, rank=rank, world_size=world)
        intact = sorted(hashed)
        # both loaders built (their scans read every shard) before any shard is damaged
        dist.barrier()
        if rank == 1:
            _damage_hidden_states(Path(features) / intact[0])
        dist.barrier()
        try:
            FeatureDataset(features, batch_size=2, rank=rank, world_size=world)
            error = None
        except DataError as exc:
            error = str(exc)
        Path(out, f"rank-{rank}.json").write_text(json.dumps({"intact": intact, "error": error}))
    finally:
        cleanup_distributed()


@pytest.mark.slow
def test_the_ranks_of_a_process_group_each_hash_a_share_of_the_shards_and_all_refuse_a_damaged_one(
    tmp_path,
):
    import json

    import torch.multiprocessing as mp
    from test_train_parallel_resume import _free_port

    # shards of 2, 2, 2, 2 and 1 rows, listed without footer hashes: the whole-file pass is what is
    # split
    first = _features(tmp_path / "features" / "fp", rows=9, rows_per_shard=2, footers=False)
    shards = sorted(p.name for p in first.parent.glob("shard-*.parquet"))
    mp.spawn(
        _verifying_rank,
        args=(2, _free_port(), str(first.parent), str(tmp_path)),
        nprocs=2,
        join=True,
    )
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    # each shard hashed once, by one rank
    assert sorted(ranks[0]["intact"] + ranks[1]["intact"]) == shards
    size = {name: (first.parent / name).stat().st_size for name in shards}
    loads = [sum(size[name] for name in report["intact"]) for report in ranks]
    # split by bytes, not by count
    assert min(loads) > 0 and abs(loads[0] - loads[1]) <= max(size.values())
    damaged = ranks[1]["intact"][0]
    for report in ranks:  # rank 0 never hashed the damaged shard, and refuses it too
        assert report["error"] is not None and f"{damaged}: sha256 differs" in report["error"]


def test_a_loader_outside_a_process_group_hashes_every_shard_whatever_rank_it_plays(
    tmp_path, record_hashes
):
    import eagle3.rundir.integrity as integrity

    first = _features(tmp_path / "features" / "fp", rows=9, rows_per_shard=2, footers=False)
    hashed = record_hashes(integrity)
    FeatureDataset(first.parent, batch_size=2, rank=1, world_size=2)
    assert sorted(hashed) == sorted(first.parent.glob("shard-*.parquet"))


def test_non_finite_step_stops_training_naming_the_shard_and_samples_and_keeps_weights_finite(
    tmp_path,
):
    config, inputs, _ = synthetic(
        **{"train.max_steps": 4, "train.save_every": 1, "train.batch_size": 2}
    )
    shard = _features(tmp_path / "features" / "fp", nan_row=5, with_manifest=False)
    source = FeatureDataset([shard], batch_size=2, shuffle=False, hidden_dtype=torch.float32)
    with pytest.raises(
        NonFiniteStep, match=rf"step 3 .*not finite.*{shard} samples \['s4', 's5'\]"
    ):
        train_on_source(config, source, inputs, tmp_path / "draft", CPU)
    latest = latest_checkpoint(tmp_path / "draft" / "ckpt")
    # the bad step was never applied nor saved
    assert latest is not None and latest.name == "step-000002"
    assert all(t.isfinite().all() for t in load_file(str(latest / "model.safetensors")).values())


def test_in_memory_batches_name_their_index_when_non_finite(tmp_path):
    config, inputs, batches = synthetic(**{"train.max_steps": 2})
    batches[1]["aux_hidden"][0, 2, 0] = float("inf")
    with pytest.raises(NonFiniteStep, match=r"in-memory batch 1"):
        train_on_source(config, ListBatchSource(batches), inputs, tmp_path / "draft", CPU)


def test_export_refuses_a_checkpoint_with_nan_weights(tmp_path):
    from eagle3.train.export import export_draft

    config, inputs, batches = synthetic(**{"train.max_steps": 1})
    train_on_source(config, ListBatchSource(batches), inputs, tmp_path / "draft", CPU)
    step = latest_checkpoint(tmp_path / "draft" / "ckpt")
    assert step is not None
    weights = load_file(str(step / "model.safetensors"))
    weights["fc.weight"][0, 0] = float("nan")
    save_file(weights, str(step / "model.safetensors"))
    with pytest.raises(DataError, match=r"NaN/inf in 1 tensor\(s\) \(fc.weight\); not exported"):
        export_draft(
            config, tmp_path / "draft", tmp_path / "vocab.safetensors", None, tmp_path / "export"
        )
    assert not (tmp_path / "export").exists()


# A training worker whose target tensors are the synthetic ones (``.format(tests=...)``: this
# directory).
WORKER = """
import sys
sys.path.insert(0, {tests!r})
from train_synthetic import synthetic
import eagle3.train.workers as w
from eagle3.train.__main__ import main
w.load_inputs = lambda *a: synthetic()[1]
sys.exit(main(sys.argv[1:]))
"""


def _worker_args(tmp_path: Path, features: Path) -> list[str]:
    """``WORKER``'s arguments: train over ``features``."""
    config, _, _ = synthetic(**{"train.batch_size": 2, "train.epochs": 1})
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    (tmp_path / "vocab.safetensors").write_bytes(b"")
    return [
        "--config-yaml",
        str(tmp_path / "config.yaml"),
        "--features",
        str(features),
        "--vocab",
        str(tmp_path / "vocab.safetensors"),
        "--out",
        str(tmp_path / "draft"),
    ]


@pytest.mark.slow
@pytest.mark.timeout(300)  # a rank left waiting in its collective would hang here
def test_a_damaged_page_read_by_one_of_two_torchrun_ranks_ends_the_run_with_its_data_error(
    tmp_path,
):
    """Only the rank that reads the damaged page raises; the other is left in the step's all-reduce,
    where it fails (gloo: the peer closed) or torchrun stops it (SIGTERM; under NCCL it would wait
    out the collective's timeout). The run ends at once with the one data error (the train stage's
    path: not retried), not a hang."""
    from test_train_parallel_resume import _free_port

    from eagle3.train.distributed import run_workers

    first = _features(tmp_path / "features" / "fp", rows=8, rows_per_shard=2)
    damaged = sorted(first.parent.glob("shard-*.parquet"))[2]
    _damage_hidden_states(damaged)
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(Path(__file__).parent)))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        f"--master-port={_free_port()}",
        str(script),
        *_worker_args(tmp_path, first.parent),
    ]
    lines: list[str] = []
    code = run_workers(command, lines.append)
    errors = [line for line in lines if DATA_ERROR_PREFIX in line]
    assert code != 0 and len(errors) == 1, "\n".join(lines[-40:])
    assert f"{damaged} row group 0: does not read back" in errors[0]


def test_a_worker_reading_a_damaged_page_mid_training_prints_one_data_error_line_and_its_exit_code(
    tmp_path,
):
    """The page check fires inside the training loop, on the rank that reads the page: its worker
    exits with the data-error code and one line (torchrun then stops the other ranks; the stage does
    not retry a data error)."""
    first = _features(tmp_path / "features" / "fp", rows=8, rows_per_shard=2)
    damaged = sorted(first.parent.glob("shard-*.parquet"))[2]
    _damage_hidden_states(damaged)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            WORKER.format(tests=str(Path(__file__).parent)),
            *_worker_args(tmp_path, first.parent),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == DATA_ERROR_EXIT, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert (
        last.startswith(DATA_ERROR_PREFIX) and f"{damaged} row group 0: does not read back" in last
    )
    assert "Traceback" not in proc.stderr
