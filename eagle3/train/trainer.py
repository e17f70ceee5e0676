"""The training loop: TTT objective, AdamW + warmup/cosine, grad clipping, checkpoints, resume.

``train_on_source(config, source, inputs, out_dir, info)`` trains one rank, in one process or as one
torchrun worker (the environment decides, see ``distributed.py``; ``eagle3.train.workers`` is what a
worker runs). Data comes through a small interface (``BatchSource``: an iterable of batch dicts with
``__len__`` = batches per epoch and ``state_dict``/``load_state_dict`` for its position), so the
Parquet ``FeatureDataset``, the online broker's batches (``eagle3.train.online.source``) and
in-memory batches plug in alike. What defines the draft besides its data is
``eagle3.train.identity``. Precision: fp32 on CPU; on GPU ``train.precision=bf16`` runs the forward
under bf16 autocast with fp32 master weights and optimizer state. A run resumes automatically from
``<out>/ckpt/latest``: weights, optimizer, scheduler, step, loader position, RNG.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from eagle3.config.pipeline import PipelineConfig
from eagle3.errors import DataError
from eagle3.model.draft import DraftModel
from eagle3.train import checkpoint as ckpt
from eagle3.train.continual import NEW_NORMS
from eagle3.train.distributed import DistInfo, all_reduce_sum, barrier, wrap_for_training
from eagle3.train.identity import DraftInputs
from eagle3.train.loss import TTTObjective, accept_length, prepare_batch
from eagle3.train.metrics import MetricsWriter

logger = logging.getLogger(__name__)


class BatchSource(Protocol):
    """What the trainer needs from a data loader (``eagle3.train.data.FeatureDataset`` implements
    it)."""

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]: ...

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def origin(self) -> str:
        """Where the batch yielded last came from (files, sample ids): named when a step goes
        non-finite."""
        ...


def build_draft(
    inputs: DraftInputs, seed: int, init: dict[str, torch.Tensor] | None = None
) -> DraftModel:
    """A fresh draft (seeded init) whose ``lm_head`` starts from the target's rows for the draft
    vocab; ``init`` (the champion's weights) replaces every tensor when given, except the EAGLE 3.1
    norms an EAGLE-3 champion lacks, which keep their fresh init (ones;
    ``eagle3.train.continual``)."""
    torch.manual_seed(seed)
    draft = DraftModel(inputs.draft_config)
    with torch.no_grad():
        draft.lm_head.weight.copy_(inputs.head.lm_head[inputs.draft_ids].float())
    if init is not None:
        fresh = {
            k: v for k, v in draft.state_dict().items() if k.startswith(NEW_NORMS) and k not in init
        }
        draft.load_state_dict({**init, **fresh}, strict=True)
    return draft


def objective_for(config: PipelineConfig, draft: DraftModel) -> TTTObjective:
    """The TTT unroll with ``train``'s steps, step weights and loss."""
    train = config.train
    return TTTObjective(
        draft,
        steps=train.ttt_steps,
        decay=train.step_weight_decay,
        loss=train.loss,
        kl_scale=train.lk_kl_scale,
        kl_decay=train.lk_kl_decay,
    )


def lr_schedule(total_steps: int, warmup_ratio: float) -> Callable[[int], float]:
    """Linear warmup over ``warmup_ratio`` of the steps, then cosine to zero."""
    warmup = max(1, round(total_steps * warmup_ratio)) if warmup_ratio > 0 else 0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _forever(source: BatchSource) -> Iterator[dict[str, torch.Tensor]]:
    while True:
        yield from source


@dataclass
class _Run:
    draft: DraftModel
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    info: DistInfo
    total_steps: int
    sharded: bool = False
    step: int = 0


def _save(
    run: _Run, config: PipelineConfig, out_dir: Path, source: BatchSource, inputs: DraftInputs
) -> Path:
    model_state, optim_state = ckpt.full_states(run.draft, run.optimizer, sharded=run.sharded)
    trainer_state = {
        "scheduler": run.scheduler.state_dict(),
        "total_steps": run.total_steps,
        "draft_config": inputs.draft_config.to_dict(),
    }
    return ckpt.save_checkpoint(
        out_dir / "ckpt",
        run.step,
        model=model_state,
        optimizer=optim_state,
        trainer=trainer_state,
        rank_state={"rng": ckpt.rng_state(), "loader": source.state_dict()},
        rank=run.info.rank,
        keep_last=config.train.keep_last,
        barrier=barrier,
    )


def _resume(run: _Run, out_dir: Path, source: BatchSource) -> None:
    path = ckpt.latest_checkpoint(out_dir / "ckpt")
    if path is None:
        return
    state = ckpt.load_checkpoint(path, rank=run.info.rank)
    ckpt.load_full_states(
        run.draft, run.optimizer, state.model, state.optimizer, sharded=run.sharded
    )
    run.scheduler.load_state_dict(state.trainer["scheduler"])
    source.load_state_dict(state.rank_state["loader"])
    ckpt.set_rng_state(state.rank_state["rng"])
    run.step = state.step
    logger.info("resumed from %s at step %d", path, run.step)


class NonFiniteStep(DataError):
    """A training step's loss or gradient is not finite: the step is not applied (the weights and
    the last checkpoint stay finite) and training stops, naming the batch's shard and samples."""


def _train_step(
    run: _Run,
    batch: dict[str, torch.Tensor],
    inputs: DraftInputs,
    config: PipelineConfig,
    source: BatchSource,
) -> tuple[torch.Tensor, int, float]:
    """One optimizer step; returns (global per-step stats [K, 3], global tokens, grad norm). Raises
    ``NonFiniteStep`` before the update when the loss or the gradient norm is NaN/inf (the norm was
    read on the host already; the loss adds one sync)."""
    device, steps = run.info.device, config.train.ttt_steps
    ids, aux, probs, masks, attn = prepare_batch(batch, inputs, steps, device)
    counts = all_reduce_sum(masks.sum(dim=(1, 2)))
    denominators = counts.clamp(min=1.0) / run.info.world_size
    bf16 = device.type == "cuda" and config.train.precision == "bf16"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else nullcontext()
    with autocast:
        loss, stats = run.model(ids, aux, inputs.head.embed, probs, masks, denominators)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(run.draft.parameters(), config.train.grad_clip)
    # float() also gathers a sharded (FSDP) norm
    loss_value, norm = float(loss.detach()), float(grad_norm)
    if not (math.isfinite(loss_value) and math.isfinite(norm)):
        raise NonFiniteStep(
            f"step {run.step + 1} (rank {run.info.rank}): loss {loss_value:.4g}, gradient norm "
            f"{norm:.4g} are not finite; not applied, training stopped. Batch: {source.origin()}. "
            "Check those rows (e.g. `eagle3 capture` again after deleting the shard and the "
            "features manifest), or lower train.lr"
        )
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    tokens = all_reduce_sum(attn.sum().float())
    return all_reduce_sum(stats.detach()), int(tokens.item()), norm


def _record(
    step: int, window: torch.Tensor, decay: float, lr: float, extra: dict[str, Any]
) -> dict[str, Any]:
    counts = window[:, 2].clamp(min=1.0)
    losses = (window[:, 0] / counts).tolist()
    accs = (window[:, 1] / counts).tolist()
    weighted = sum((decay**k) * loss for k, loss in enumerate(losses))
    return {
        "step": step,
        "loss": weighted,
        "loss_k": losses,
        "acc": accs,
        "accept_length_sim": accept_length(accs),
        "lr": lr,
        **extra,
    }


def _loop(
    run: _Run, config: PipelineConfig, out_dir: Path, source: BatchSource, inputs: DraftInputs
) -> dict[str, Any]:
    writer = MetricsWriter(out_dir, enabled=run.info.is_main, resume_step=run.step)
    window = torch.zeros(config.train.ttt_steps, 3)
    first: dict[str, Any] | None = None
    last: dict[str, Any] = {}
    tokens, started, batches = 0, time.monotonic(), _forever(source)
    while run.step < run.total_steps:
        stats, n_tokens, grad_norm = _train_step(run, next(batches), inputs, config, source)
        run.step += 1
        window += stats.cpu()
        tokens += n_tokens
        if run.step % config.train.log_every == 0 or run.step == run.total_steps:
            elapsed = max(time.monotonic() - started, 1e-9)
            extra = {
                "grad_norm": grad_norm,
                "tokens": tokens,
                "tokens_per_s": tokens / elapsed,
                "total_steps": run.total_steps,
            }
            lr = run.scheduler.get_last_lr()[0]
            last = _record(run.step, window, config.train.step_weight_decay, lr, extra)
            first = first or last
            writer.log(last)
            if run.info.is_main:
                acc, accept = [round(a, 3) for a in last["acc"]], last["accept_length_sim"]
                line = (run.step, run.total_steps, last["loss"], acc, accept)
                logger.info("step %d/%d loss %.4f acc %s accept~%.2f", *line)
            window.zero_()
        if run.step % config.train.save_every == 0 or run.step == run.total_steps:
            _save(run, config, out_dir, source, inputs)
    writer.close()
    return {"first": first, "last": last}


def train_on_source(
    config: PipelineConfig,
    source: BatchSource,
    inputs: DraftInputs,
    out_dir: Path,
    info: DistInfo,
    *,
    init: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Train (or resume, or find finished) a draft on ``source``; returns a small summary dict.
    ``init``: start from these weights (the champion's) with the fine-tuning peak lr ``train.lr x
    train.champion_lr_scale``."""
    out_dir = Path(out_dir)
    inputs = inputs.to(info.device)
    draft = build_draft(inputs, config.train.seed, init).to(info.device)
    lr = config.train.lr * (config.train.champion_lr_scale if init is not None else 1.0)
    objective = objective_for(config, draft)
    bf16 = info.device.type == "cuda" and config.train.precision == "bf16"
    model = wrap_for_training(objective, parallel=config.train.parallel, info=info, bf16=bf16)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=lr, weight_decay=config.train.weight_decay)
    total = config.train.max_steps or config.train.epochs * len(source)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_schedule(total, config.train.warmup_ratio)
    )
    sharded = info.distributed and config.train.parallel == "fsdp"
    run = _Run(draft, model, optimizer, scheduler, info, total, sharded=sharded)
    _resume(run, out_dir, source)
    logs = _loop(run, config, out_dir, source, inputs)
    latest = ckpt.latest_checkpoint(out_dir / "ckpt")
    last = logs["last"]
    return {
        "out_dir": str(out_dir),
        "checkpoint": str(latest) if latest else None,
        "steps": run.step,
        "first_loss": (logs["first"] or {}).get("loss"),
        "final_loss": last.get("loss"),
        "accept_length_sim": last.get("accept_length_sim"),
        "tokens_per_s": last.get("tokens_per_s"),
    }
