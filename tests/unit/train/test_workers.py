"""The training workers' protocol: one command for stored and online features, one process or
torchrun ranks; a worker's data error is one line and its own exit code; the parent raises it as a
data error (not retried) and any other failure as a retried one."""

from __future__ import annotations

import sys

import pytest

from eagle3.errors import DATA_ERROR_EXIT, DATA_ERROR_PREFIX, DataError
from eagle3.train.workers import WorkersExit, run_worker, stored_args, worker_command


def test_one_command_names_the_batch_source_and_runs_torchrun_only_for_several_processes(tmp_path):
    cfg, vocab, out = tmp_path / "config.yaml", tmp_path / "vocab.safetensors", tmp_path / "draft"
    stored = worker_command(cfg, vocab, out, stored_args(tmp_path / "features"))
    assert stored == [
        sys.executable,
        "-m",
        "eagle3.train",
        "--config-yaml",
        str(cfg),
        "--features",
        str(tmp_path / "features"),
        "--vocab",
        str(vocab),
        "--out",
        str(out),
    ]
    online = ["--regen", "r", "--ray-address", "a", "--broker", "b"]
    ranks = worker_command(cfg, vocab, out, online, nproc=2, master_port=1234)
    assert (
        ranks[:3] == [sys.executable, "-m", "torch.distributed.run"]
        and "--nproc-per-node=2" in ranks
    )
    assert "--master-port=1234" in ranks and ranks[ranks.index("-m", 3) :] == [
        "-m",
        "eagle3.train",
        "--config-yaml",
        str(cfg),
        *online,
        "--vocab",
        str(vocab),
        "--out",
        str(out),
    ]


def test_a_workers_data_error_is_one_line_and_its_exit_code(capsys):
    def damaged() -> dict:
        raise DataError("shard-00002.parquet row group 0: does not read back; rebuild it")

    assert run_worker(damaged, rank=1) == DATA_ERROR_EXIT
    assert (
        capsys.readouterr().err
        == f"{DATA_ERROR_PREFIX}shard-00002.parquet row group 0: does not read back; "
        "rebuild it\n"
    )
    assert run_worker(lambda: {"steps": 4}, rank=0) == 0


def test_the_parent_raises_the_reported_data_error_else_a_retried_failure():
    with pytest.raises(DataError, match=r"^bad row$"):
        WorkersExit(code=DATA_ERROR_EXIT, data_errors=["bad row"]).raise_for_failure(
            "training exited"
        )
    with pytest.raises(RuntimeError, match=r"^training exited with code 1"):
        WorkersExit(code=1).raise_for_failure("training exited with code 1")
    WorkersExit(code=0, data_errors=["a line that only looked like one"]).raise_for_failure(
        "unused"
    )
