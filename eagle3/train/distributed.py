"""Process groups and parallel wrappers, kept apart from the model file (torchtitan's
``parallelize.py`` idea).

Workers are started by ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment);
without those variables everything runs as a single process and no process group is created.
Backend: NCCL on CUDA, gloo on CPU. Parallelism: DDP for drafts that fit on a device (the usual
case: a few hundred MB), FSDP2 (``fully_shard``) for large ones (``train.parallel=fsdp``), with bf16
parameters and fp32 gradient reduction on GPU.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from eagle3.runtime.stop import raise_if_stopped, spawn

logger = logging.getLogger(__name__)


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` picks ``cuda:<local_rank>`` when CUDA exists, else CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(name)


def init_distributed(device_name: str) -> DistInfo:
    """Join the torchrun process group when the environment asks for one; otherwise a single
    process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local_rank)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)
        logger.info("rank %d/%d joined the %s process group on %s", rank, world, backend, device)
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=device)


def cleanup_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks in place (no-op in a single process)."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def gather_lines(lines: list[str]) -> list[str]:
    """Every rank's ``lines``, in rank order, on every rank (the lines themselves in a single
    process)."""
    if not dist.is_initialized():
        return lines
    gathered: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, lines)
    return [line for rank_lines in gathered for line in rank_lines or []]


def wrap_for_training(
    objective: nn.Module, *, parallel: str, info: DistInfo, bf16: bool
) -> nn.Module:
    """Wrap the TTT objective: nothing (one process), DDP, or FSDP2 on the draft's decoder layer and
    the draft."""
    if not info.distributed:
        return objective
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [info.device.index] if info.device.type == "cuda" else None
        return DistributedDataParallel(objective, device_ids=device_ids, broadcast_buffers=False)
    if parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if bf16
            else None
        )
        kwargs = {"mp_policy": policy} if policy is not None else {}
        fully_shard(objective.draft.midlayer, **kwargs)
        fully_shard(objective.draft, **kwargs)
        return objective
    raise ValueError(f"train.parallel={parallel!r} is unknown: set it to 'ddp' or 'fsdp'")


def run_workers(
    command: list[str], on_line: Callable[[str], None], *, env: dict[str, str] | None = None
) -> int:
    """Run the training command, handing every output line (stdout and stderr merged) to
    ``on_line``.

    Returns the exit code; the caller decides whether a non-zero code is a failure to retry (a retry
    resumes from the ``latest`` checkpoint, so it loses at most ``train.save_every`` steps).
    Raises ``Stopped`` when the run was stopped (``eagle3.runtime.stop``: the workers got SIGTERM),
    which is never retried.
    """
    with spawn(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env={**os.environ, **(env or {})},
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        code = proc.wait()
    raise_if_stopped("training")
    return code
