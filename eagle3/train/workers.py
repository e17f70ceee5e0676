"""The training workers' protocol, both sides, for stored and online features alike.

* **The command.** The parent (the train stage's unit) starts ``python -m eagle3.train``: one
  process, or one per rank under torchrun (``train.nproc``; several nodes with ``nnodes``). Where
  the batches come from is the only difference between the two ways of training: ``--features``
  (stored feature shards) or ``--regen``, ``--ray-address`` and ``--broker`` (online: the run's
  broker hands out the batches its producers capture).
* **The worker.** Every rank runs ``train_rank``: the draft's inputs, the start (``start.json``: a
  champion night starts from the champion's weights on the rows it names), the batch source, then
  the one loop (``eagle3.train.trainer.train_on_source``); the process group is always cleaned up.
* **Damaged data.** A worker that meets damaged data (a ``DataError``) prints one line,
  ``DATA_ERROR_PREFIX`` and the message, and exits with ``DATA_ERROR_EXIT``. The parent reads every
  output line (torchrun may prefix a worker's lines with its rank) and raises that ``DataError``,
  which is not retried: the same data fails the same way. Any other non-zero exit is a
  ``RuntimeError``, retried: a retry resumes from ``ckpt/latest``.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.errors import DATA_ERROR_EXIT, DATA_ERROR_PREFIX, DataError
from eagle3.train.continual import Start, champion_weights
from eagle3.train.distributed import DistInfo, init_distributed, run_workers
from eagle3.train.identity import load_inputs
from eagle3.train.trainer import BatchSource, train_on_source

logger = logging.getLogger(__name__)

# How a rank gets its batches: given its place in the process group and the run's start.
Batches = Callable[[DistInfo, Start], BatchSource]


def worker_command(
    config_yaml: Path,
    vocab: Path,
    out_dir: Path,
    source_args: list[str],
    *,
    nproc: int = 1,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
) -> list[str]:
    """The command that starts training: ``python -m eagle3.train ...`` for one process, else under
    torchrun. ``source_args`` say where the batches come from (``stored_args``, or the online
    feed's)."""
    worker = ["-m", "eagle3.train", "--config-yaml", str(config_yaml), *source_args]
    worker += ["--vocab", str(vocab), "--out", str(out_dir)]
    if nproc == 1 and nnodes == 1:
        return [sys.executable, *worker]
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    launcher += [f"--nnodes={nnodes}", f"--node-rank={node_rank}"]
    launcher += [f"--master-addr={master_addr}", f"--master-port={master_port}"]
    return [*launcher, *worker]


def stored_args(features_dir: Path) -> list[str]:
    """The workers' arguments for stored features: the finished features stage they read."""
    return ["--features", str(features_dir)]


@dataclass
class Feed:
    """How the batches reach a run's workers: their arguments (``stored_args``, or the online run's
    broker) and, once the run has ended, what the feed adds to a failure's message (``note``) and to
    the unit's report (``detail``: online, the store's final status)."""

    args: list[str]
    name: str = "training"  # how a failure's message names the run
    note: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class WorkersExit:
    """How a training command ended: its exit code and the data errors its workers reported."""

    code: int
    data_errors: list[str] = field(default_factory=list)

    def raise_for_failure(self, failure: str) -> None:
        """The first reported ``DataError`` (not retried), or a ``RuntimeError`` saying ``failure``
        for any other non-zero exit (retried; a retry resumes from the latest checkpoint); nothing
        when the workers succeeded."""
        if self.code != 0 and self.data_errors:
            raise DataError(self.data_errors[0])
        if self.code != 0:
            raise RuntimeError(failure)


def run_training(command: list[str], *, log: logging.Logger = logger) -> WorkersExit:
    """Run the training command, each of its output lines logged to ``log``, and collect the data
    errors its workers reported (the parent's side of the protocol)."""
    log.info("starting: %s", " ".join(command))
    data_errors: list[str] = []

    def on_line(line: str) -> None:
        log.info("%s", line)
        if DATA_ERROR_PREFIX in line:  # torchrun may prefix worker lines with their rank
            data_errors.append(line.split(DATA_ERROR_PREFIX, 1)[1])

    return WorkersExit(code=run_workers(command, on_line), data_errors=data_errors)


def run_worker(work: Callable[[], dict[str, Any]], *, rank: int) -> int:
    """A worker's exit code for ``work`` (the worker's side of the protocol): 0, or
    ``DATA_ERROR_EXIT`` after one line naming the damaged data (no traceback: the message is the
    whole story). Rank 0 logs the summary."""
    try:
        summary = work()
    except DataError as exc:
        print(f"{DATA_ERROR_PREFIX}{exc}", file=sys.stderr, flush=True)
        return DATA_ERROR_EXIT
    if rank == 0:
        logger.info("summary %s", json.dumps(summary))
    return 0


def stored_batches(config: PipelineConfig, features_dir: Path) -> Batches:
    """The Parquet feature loader for each rank; a champion night's start names the rows it trains
    on."""

    def source(info: DistInfo, start: Start) -> BatchSource:
        from eagle3.train.data import FeatureDataset

        return FeatureDataset(
            Path(features_dir),
            rows=start.rows if start.champion else None,
            batch_size=config.train.batch_size,
            max_seq_len=config.train.max_seq_len,
            seed=config.train.seed,
            rank=info.rank,
            world_size=info.world_size,
            device=info.device,  # fp8 features decode there (on the GPU when training on one)
        )

    return source


def train_rank(
    config: PipelineConfig, vocab_path: Path, out_dir: Path, batches: Batches
) -> dict[str, Any]:
    """Train (or resume, or find finished) a draft into ``out_dir`` as this process's rank (single
    process or a torchrun worker); a ``start.json`` there (``eagle3.train.continual``, written by
    the train stage) starts it from the champion. The process group this call joins is left before
    it returns."""
    import torch.distributed as dist

    owns_group = not dist.is_initialized()
    info = init_distributed(config.train.device)
    start = Start.read(Path(out_dir))
    try:
        inputs = load_inputs(config, Path(vocab_path))
        source = batches(info, start)
        init = champion_weights(start) if start.champion else None
        return train_on_source(config, source, inputs, Path(out_dir), info, init=init)
    finally:
        if owns_group and dist.is_initialized():
            dist.destroy_process_group()


def train(
    config: PipelineConfig, features_dir: Path, vocab_path: Path, out_dir: Path
) -> dict[str, Any]:
    """Train a draft from stored feature shards and a vocab into ``out_dir``, in this process."""
    return train_rank(config, vocab_path, out_dir, stored_batches(config, features_dir))
