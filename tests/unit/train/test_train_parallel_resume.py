"""Distributed and resume guarantees on CPU: two gloo ranks (DDP or FSDP2) == one process with the
same global batch, and a run killed with SIGKILL mid-training then resumed ends with exactly the
weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from train_synthetic import B, synthetic, write_features

from eagle3.train.data import FeatureDataset
from eagle3.train.distributed import DistInfo
from eagle3.train.trainer import train_on_source
from eagle3.worlds.distil import ListBatchSource

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str, parallel: str) -> None:
    from eagle3.train.distributed import cleanup_distributed, init_distributed
    from eagle3.train.trainer import train_on_source
    from eagle3.worlds.distil import ListBatchSource

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    info = init_distributed("cpu")
    try:
        config, inputs, batches = synthetic(**{"train.parallel": parallel})
        train_on_source(
            config, ListBatchSource(batches, rank=rank, world_size=world), inputs, Path(out), info
        )
    finally:
        cleanup_distributed()


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_gloo_ranks_match_one_process_with_the_same_global_batch(tmp_path, parallel):
    config, inputs, batches = synthetic(**{"train.parallel": parallel})
    single = train_on_source(config, ListBatchSource(batches), inputs, tmp_path / "one", CPU)
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path / "two"), parallel), nprocs=2, join=True)
    one = load_file(str(Path(single["checkpoint"]) / "model.safetensors"))
    two = load_file(str(tmp_path / "two" / "ckpt" / "step-000012" / "model.safetensors"))
    assert one.keys() == two.keys()
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-5, msg=key)
    records = [
        json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()
    ]
    single_records = [
        json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()
    ]
    assert records[0]["loss"] == pytest.approx(single_records[0]["loss"], rel=1e-4)


RUN_SCRIPT = textwrap.dedent(
    f"""
    import os, signal, sys
    sys.path.insert(0, {str(Path(__file__).parent)!r})
    import torch
    from train_synthetic import B, synthetic
    from pathlib import Path
    from eagle3.train.data import FeatureDataset
    from eagle3.train.distributed import DistInfo
    from eagle3.train.trainer import train_on_source

    class KillAt(FeatureDataset):
        def __init__(self, features, kill_at):
            super().__init__(features, batch_size=B, seed=0)
            self.kill_at, self.served = kill_at, 0

        def __iter__(self):
            for batch in super().__iter__():
                self.served += 1
                if self.served == self.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)  # mid-step, between checkpoints
                yield batch

    torch.set_num_threads(1)
    out, kill_at, features = Path(sys.argv[1]), int(sys.argv[2]), sorted(Path(sys.argv[3]).glob("shard-*.parquet"))
    config, inputs, _ = synthetic(**{{"train.save_every": 3}})
    train_on_source(config, KillAt(features, kill_at), inputs, out, DistInfo(0, 1, 0, torch.device("cpu")))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["raw", "fp8_aux", "fp8_all", "fp8_topk"])
def test_kill_9_mid_training_then_resume_gives_the_uninterrupted_weights(tmp_path, encoding):
    """From feature shards in each encoding (the Parquet loader's position is part of the
    checkpoint)."""
    script = tmp_path / "run.py"
    script.write_text(RUN_SCRIPT)

    def run(out: Path, kill_at: int) -> int:
        return subprocess.run(
            [sys.executable, str(script), str(out), str(kill_at), str(tmp_path / "features")],
            check=False,
            timeout=600,
        ).returncode

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the subprocesses' setting: same kernels, same bits
    try:
        config, inputs, batches = synthetic(**{"train.save_every": 3})
        shards = write_features(batches, tmp_path / "features", encoding, inputs.head.lm_head)
        source = FeatureDataset(shards, batch_size=B, seed=0)
        train_on_source(config, source, inputs, tmp_path / "straight", CPU)
    finally:
        torch.set_num_threads(threads)
    # killed while serving the 8th batch, after the step-6 checkpoint
    assert run(tmp_path / "killed", 8) == -9
    assert (tmp_path / "killed" / "ckpt" / "latest").read_text().strip() == "step-000006"
    assert run(tmp_path / "killed", 0) == 0
    final = "step-000012"
    straight = load_file(str(tmp_path / "straight" / "ckpt" / final / "model.safetensors"))
    resumed = load_file(str(tmp_path / "killed" / "ckpt" / final / "model.safetensors"))
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
    steps = [
        json.loads(line)["step"]
        for line in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == list(range(1, 13))  # no duplicate records for the redone steps
