"""The training loop: TTT objective, AdamW + warmup/cosine, grad clipping, checkpoints, metrics, resume.

``train(config, features_dir, vocab_path, out_dir)`` runs in-process, as one process or as one torchrun worker
(the environment decides, see ``distributed.py``). Data comes through a small interface (``BatchSource``: an
iterable of batch dicts with ``__len__`` = batches per epoch and ``state_dict``/``load_state_dict`` for its
position), so the Parquet ``FeatureDataset`` and in-memory batches plug in alike. Precision: fp32 on CPU; on GPU
``train.precision=bf16`` runs the forward under bf16 autocast with fp32 master weights and optimizer state.
A run resumes automatically from ``<out>/ckpt/latest``: weights, optimizer, scheduler, step, loader position, RNG.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file

from eagle3.config.pipeline import PipelineConfig
from eagle3.config.train import MLA_SHAPE, TrainConfig
from eagle3.errors import DataError
from eagle3.model.draft import DraftConfig, DraftModel
from eagle3.model.export_format import target_ids
from eagle3.model.target_weights import TargetHead, load_target_head
from eagle3.rundir.runroot import fingerprint
from eagle3.target_io import load_hf_config
from eagle3.train import checkpoint as ckpt
from eagle3.train.distributed import DistInfo, all_reduce_sum, barrier, init_distributed, wrap_for_training
from eagle3.train.loss import TTTObjective, accept_length, batch_target, step_masks
from eagle3.train.metrics import MetricsWriter

logger = logging.getLogger(__name__)

_OPERATIONAL = {"nproc", "device", "save_every", "keep_last", "log_every", "features", "online"}
# Keys added after drafts were first fingerprinted: left out while at their default, so every draft trained before
# them (and every recipe that does not set them) keeps its fingerprint and its finished stage directory.
_ADDED_KEYS = ("architecture", "loss", "lk_kl_scale", "lk_kl_decay")
_ADDED_ARCHITECTURE_KEYS = ("attention", *MLA_SHAPE)  # likewise inside train.architecture
# In the fingerprint only through a champion night's start (``eagle3.train.continual.Start.identity``).
_CONTINUAL = {"init", "replay", "champion_lr_scale"}


class BatchSource(Protocol):
    """What the trainer needs from a data loader (``eagle3.train.data.FeatureDataset`` implements it)."""

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]: ...

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def origin(self) -> str:
        """Where the batch yielded last came from (files, sample ids): named when a step goes non-finite."""
        ...


class ListBatchSource:
    """In-memory global batches; rank ``r`` of ``w`` trains on rows ``r::w`` of each (tests, benchmarks)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]], *, rank: int = 0, world_size: int = 1) -> None:
        self.batches, self.rank, self.world_size = batches, rank, world_size
        self.epoch, self.index = 0, 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while self.index < len(self.batches):
            batch = self.batches[self.index]
            self.index += 1
            yield {k: v[self.rank :: self.world_size] for k, v in batch.items()}
        self.epoch, self.index = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def origin(self) -> str:
        return f"in-memory batch {self.index - 1} (epoch {self.epoch})"

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


@dataclass
class DraftInputs:
    """Everything besides data that defines a draft run: its architecture, the frozen target tensors, the vocab."""

    draft_config: DraftConfig
    head: TargetHead
    d2t: torch.Tensor

    @property
    def draft_ids(self) -> torch.Tensor:
        """Target id of each draft id (the export format's d2t rule), on ``d2t``'s device."""
        return target_ids(self.d2t)

    def to(self, device: torch.device) -> DraftInputs:
        """The frozen target tensors and the vocab map on the training device, placed once per run. Moving them in
        every step copied the target's embedding and ``lm_head`` host-to-device at each step: 2 x 2.35 GB in bf16
        for Kimi-K2.5 (vocab 163,840 x H 7168), ~0.2-0.5 s of synchronous copy per step, on every rank at once.
        Resident, they cost that memory once per GPU (a tied head is moved once)."""
        embed = self.head.embed.to(device)
        lm_head = embed if self.head.tied else self.head.lm_head.to(device)
        return replace(self, head=TargetHead(embed=embed, lm_head=lm_head, tied=self.head.tied),
                       d2t=self.d2t.to(device))


def draft_fingerprint(config: PipelineConfig, features_fp: str, vocab_fp: str,
                      start: dict[str, Any] | None = None) -> str:  # fmt: skip
    """Stage fingerprint of a draft: features, vocab, the result-relevant train config, target and export size,
    and, for a night built on the champion, its start (``Start.identity``: the champion's id, replay, lr scale)."""
    train_cfg = config.train.model_dump(mode="json", exclude=_OPERATIONAL | _CONTINUAL)
    defaults = TrainConfig().model_dump(mode="json")
    arch_defaults = defaults["architecture"]
    for cfg in (train_cfg, defaults):
        arch = cfg["architecture"].items()
        added = _ADDED_ARCHITECTURE_KEYS
        cfg["architecture"] = {k: v for k, v in arch if k not in added or v != arch_defaults[k]}
    train_cfg = {k: v for k, v in train_cfg.items() if k not in _ADDED_KEYS or v != defaults[k]}
    parts = ("draft", features_fp, vocab_fp, train_cfg, config.target.model_dump(mode="json"))
    return fingerprint(*parts, start) if start else fingerprint(*parts)


def build_draft(inputs: DraftInputs, seed: int, init: dict[str, torch.Tensor] | None = None) -> DraftModel:
    """A fresh draft (seeded init) whose ``lm_head`` starts from the target's rows for the draft vocab; ``init``
    (the champion's weights) replaces every tensor when given, except the EAGLE 3.1 norms an EAGLE-3 champion lacks,
    which keep their fresh init (ones; ``eagle3.train.continual``)."""
    from eagle3.train.continual import NEW_NORMS

    torch.manual_seed(seed)
    draft = DraftModel(inputs.draft_config)
    with torch.no_grad():
        draft.lm_head.weight.copy_(inputs.head.lm_head[inputs.draft_ids].float())
    if init is not None:
        fresh = {k: v for k, v in draft.state_dict().items() if k.startswith(NEW_NORMS) and k not in init}
        draft.load_state_dict({**init, **fresh}, strict=True)
    return draft


def objective_for(config: PipelineConfig, draft: DraftModel) -> TTTObjective:
    """The TTT unroll with ``train``'s steps, step weights and loss."""
    train = config.train
    return TTTObjective(draft, steps=train.ttt_steps, decay=train.step_weight_decay, loss=train.loss,
                        kl_scale=train.lk_kl_scale, kl_decay=train.lk_kl_decay)


def lr_schedule(total_steps: int, warmup_ratio: float):
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


def _full_states(run: _Run) -> tuple[dict[str, Any], dict[str, Any]]:
    """Full model and optimizer state, optimizer keyed by parameter name (the same format DCP uses for FSDP)."""
    if run.sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict as get_optim

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(run.draft, options=options), get_optim(run.draft, run.optimizer, options=options)
    names = [name for name, _ in run.draft.named_parameters()]
    optim = run.optimizer.state_dict()
    return run.draft.state_dict(), {
        "state": {names[i]: v for i, v in optim["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in optim["param_groups"]],
    }


def _load_full_states(run: _Run, model: dict[str, Any], optim: dict[str, Any]) -> None:
    if run.sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict as set_optim

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        set_model_state_dict(run.draft, model, options=options)
        set_optim(run.draft, run.optimizer, optim, options=options)
        return
    index = {name: i for i, (name, _) in enumerate(run.draft.named_parameters())}
    run.draft.load_state_dict(model)
    run.optimizer.load_state_dict({
        "state": {index[name]: v for name, v in optim["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in optim["param_groups"]],
    })


def _save(run: _Run, config: PipelineConfig, out_dir: Path, source: BatchSource, inputs: DraftInputs) -> Path:
    model_state, optim_state = _full_states(run)
    trainer_state = {"scheduler": run.scheduler.state_dict(), "total_steps": run.total_steps,
                     "draft_config": inputs.draft_config.to_dict()}
    return ckpt.save_checkpoint(
        out_dir / "ckpt", run.step, model=model_state, optimizer=optim_state, trainer=trainer_state,
        rank_state={"rng": ckpt.rng_state(), "loader": source.state_dict()}, rank=run.info.rank,
        keep_last=config.train.keep_last, barrier=barrier,
    )


def _resume(run: _Run, out_dir: Path, source: BatchSource) -> None:
    path = ckpt.latest_checkpoint(out_dir / "ckpt")
    if path is None:
        return
    state = ckpt.load_checkpoint(path, rank=run.info.rank)
    _load_full_states(run, state.model, state.optimizer)
    run.scheduler.load_state_dict(state.trainer["scheduler"])
    source.load_state_dict(state.rank_state["loader"])
    ckpt.set_rng_state(state.rank_state["rng"])
    run.step = state.step
    logger.info("resumed from %s at step %d", path, run.step)


def _prepare(batch: dict[str, torch.Tensor], inputs: DraftInputs, steps: int, device: torch.device):
    """Device tensors, target distribution and per-step masks for one batch (``inputs`` already on ``device``)."""
    ids = batch["input_ids"].to(device).long()
    aux = batch["aux_hidden"].to(device).float()
    attn = batch["attention_mask"].to(device).bool()
    probs, in_vocab = batch_target(batch, inputs.head.lm_head, inputs.draft_ids)
    masks = step_masks(batch["loss_mask"].to(device), attn, in_vocab, steps)
    return ids, aux, probs, masks, attn


class NonFiniteStep(DataError):
    """A training step's loss or gradient is not finite: the step is not applied (the weights and the last
    checkpoint stay finite) and training stops, naming the batch's shard and samples."""


def _train_step(
    run: _Run, batch: dict[str, torch.Tensor], inputs: DraftInputs, config: PipelineConfig, source: BatchSource
):
    """One optimizer step; returns (global per-step stats [K, 3], global tokens, grad norm). Raises
    ``NonFiniteStep`` before the update when the loss or the gradient norm is NaN/inf (the norm was read on the
    host already; the loss adds one sync)."""
    device, steps = run.info.device, config.train.ttt_steps
    ids, aux, probs, masks, attn = _prepare(batch, inputs, steps, device)
    counts = all_reduce_sum(masks.sum(dim=(1, 2)))
    denominators = counts.clamp(min=1.0) / run.info.world_size
    bf16 = device.type == "cuda" and config.train.precision == "bf16"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else nullcontext()
    with autocast:
        loss, stats = run.model(ids, aux, inputs.head.embed, probs, masks, denominators)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(run.draft.parameters(), config.train.grad_clip)
    loss_value, norm = float(loss.detach()), float(grad_norm)  # float() also gathers a sharded (FSDP) norm
    if not (math.isfinite(loss_value) and math.isfinite(norm)):
        raise NonFiniteStep(
            f"step {run.step + 1} (rank {run.info.rank}): loss {loss_value:.4g}, gradient norm {norm:.4g} are not "
            f"finite; not applied, training stopped. Batch: {source.origin()}. Check those rows (e.g. `eagle3 "
            "capture` again after deleting the shard and the features manifest), or lower train.lr"
        )
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    tokens = all_reduce_sum(attn.sum().float())
    return all_reduce_sum(stats.detach()), int(tokens.item()), norm


def _record(step: int, window: torch.Tensor, decay: float, lr: float, extra: dict[str, Any]) -> dict[str, Any]:
    counts = window[:, 2].clamp(min=1.0)
    losses = (window[:, 0] / counts).tolist()
    accs = (window[:, 1] / counts).tolist()
    weighted = sum((decay**k) * loss for k, loss in enumerate(losses))
    return {"step": step, "loss": weighted, "loss_k": losses, "acc": accs,
            "accept_length_sim": accept_length(accs), "lr": lr, **extra}


def _loop(run: _Run, config: PipelineConfig, out_dir: Path, source: BatchSource, inputs: DraftInputs) -> dict:
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
            extra = {"grad_norm": grad_norm, "tokens": tokens, "tokens_per_s": tokens / elapsed,
                     "total_steps": run.total_steps}
            last = _record(run.step, window, config.train.step_weight_decay, run.scheduler.get_last_lr()[0], extra)
            first = first or last
            writer.log(last)
            if run.info.is_main:
                logger.info("step %d/%d loss %.4f acc %s accept~%.2f", run.step, run.total_steps, last["loss"],
                            [round(a, 3) for a in last["acc"]], last["accept_length_sim"])
            window.zero_()
        if run.step % config.train.save_every == 0 or run.step == run.total_steps:
            _save(run, config, out_dir, source, inputs)
    writer.close()
    return {"first": first, "last": last}


def train_on_source(
    config: PipelineConfig, source: BatchSource, inputs: DraftInputs, out_dir: Path, info: DistInfo,
    *, init: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Train (or resume, or find finished) a draft on ``source``; returns a small summary dict. ``init``: start
    from these weights (the champion's) with the fine-tuning peak lr ``train.lr x train.champion_lr_scale``."""
    out_dir = Path(out_dir)
    inputs = inputs.to(info.device)
    draft = build_draft(inputs, config.train.seed, init).to(info.device)
    lr = config.train.lr * (config.train.champion_lr_scale if init is not None else 1.0)
    objective = objective_for(config, draft)
    bf16 = info.device.type == "cuda" and config.train.precision == "bf16"
    model = wrap_for_training(objective, parallel=config.train.parallel, info=info, bf16=bf16)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=lr, weight_decay=config.train.weight_decay)
    total = config.train.max_steps or config.train.epochs * len(source)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(total, config.train.warmup_ratio))
    sharded = info.distributed and config.train.parallel == "fsdp"
    run = _Run(draft, model, optimizer, scheduler, info, total, sharded=sharded)
    _resume(run, out_dir, source)
    logs = _loop(run, config, out_dir, source, inputs)
    latest = ckpt.latest_checkpoint(out_dir / "ckpt")
    last = logs["last"]
    return {
        "out_dir": str(out_dir), "checkpoint": str(latest) if latest else None, "steps": run.step,
        "first_loss": (logs["first"] or {}).get("loss"), "final_loss": last.get("loss"),
        "accept_length_sim": last.get("accept_length_sim"), "tokens_per_s": last.get("tokens_per_s"),
    }


def load_inputs(config: PipelineConfig, vocab_path: Path) -> DraftInputs:
    """Draft architecture from the target's HF config, the frozen target tensors and the draft vocab."""
    vocab = load_file(str(vocab_path))
    hf_config = load_hf_config(config.target)
    draft_config = draft_config_for(config, hf_config, draft_vocab_size=len(vocab["d2t"]))
    return DraftInputs(draft_config=draft_config, head=target_head(config, hf_config), d2t=vocab["d2t"].long())


def draft_config_for(config: PipelineConfig, hf_config: Any, *, draft_vocab_size: int) -> DraftConfig:
    """The draft architecture this config trains for the target ``hf_config`` describes."""
    return DraftConfig.from_target_config(
        hf_config,
        draft_vocab_size=draft_vocab_size,
        max_position_embeddings=max(config.target.context_length, config.export.max_position_embeddings or 0),
        intermediate_size=config.train.draft_intermediate_size,
        **config.train.architecture.model_dump(),
    )


def target_head(config: PipelineConfig, hf_config: Any) -> TargetHead:
    """The frozen target embedding and ``lm_head`` (tied or not, as the target's HF config says)."""
    text_config = getattr(hf_config, "text_config", None) or hf_config
    return load_target_head(config.target.model_path, revision=config.target.revision,
                            tie_word_embeddings=getattr(text_config, "tie_word_embeddings", None))


@torch.no_grad()
def accept_on_features(config: PipelineConfig, export_dir: Path, shard: Path, *, rows: int) -> float:
    """Simulated accept length (``accept_length`` of the per-step accuracies, as ``metrics.jsonl`` reports it) of
    an exported draft on the first ``rows`` rows of one feature shard, on CPU: the target is not run, its captured
    states are; a draft whose weights were damaged after training falls to ~1."""
    from eagle3.model.export_format import load_draft
    from eagle3.train.data import FeatureDataset

    draft, d2t, _, _ = load_draft(export_dir)
    hf_config = load_hf_config(config.target)
    inputs = DraftInputs(draft_config=draft.config, head=target_head(config, hf_config), d2t=d2t.long())
    loader = FeatureDataset([shard], batch_size=rows, shuffle=False, max_seq_len=config.train.max_seq_len,
                            hidden_dtype=torch.float32)
    steps = config.train.ttt_steps
    ids, aux, probs, masks, _ = _prepare(next(iter(loader)), inputs, steps, torch.device("cpu"))
    objective = TTTObjective(draft.float(), steps=steps, decay=config.train.step_weight_decay)
    _, stats = objective(ids, aux, inputs.head.embed.float(), probs, masks, masks.sum(dim=(1, 2)).clamp(min=1.0))
    return accept_length((stats[:, 1] / stats[:, 2].clamp(min=1.0)).tolist())


def feature_source(config: PipelineConfig, features_dir: Path, info: DistInfo,
                   rows: dict[str, list[int]] | None = None) -> BatchSource:  # fmt: skip
    """The Parquet feature loader for this rank (``rows``: only those, shard file name -> row indices)."""
    from eagle3.train.data import FeatureDataset

    return FeatureDataset(
        features_dir,
        rows=rows,
        batch_size=config.train.batch_size,
        max_seq_len=config.train.max_seq_len,
        seed=config.train.seed,
        rank=info.rank,
        world_size=info.world_size,
        device=info.device,  # fp8 features decode there (on the GPU when training on one)
    )


def train(config: PipelineConfig, features_dir: Path, vocab_path: Path, out_dir: Path) -> dict[str, Any]:
    """Train a draft from feature shards and a vocab into ``out_dir`` (single process or a torchrun worker); a
    ``start.json`` there (``eagle3.train.continual``, written by the train stage) starts it from the champion on
    the rows it names."""
    import torch.distributed as dist

    from eagle3.train.continual import Start, champion_weights

    owns_group = not dist.is_initialized()
    info = init_distributed(config.train.device)
    start = Start.read(Path(out_dir))
    try:
        inputs = load_inputs(config, Path(vocab_path))
        source = feature_source(config, Path(features_dir), info, start.rows if start.champion else None)
        init = champion_weights(start) if start.champion else None
        return train_on_source(config, source, inputs, Path(out_dir), info, init=init)
    finally:
        if owns_group and dist.is_initialized():
            dist.destroy_process_group()


@torch.no_grad()
def batches_from_target(
    target: torch.nn.Module,
    sequences: list[tuple[list[int], list[int]]],
    *,
    layer_ids: list[int],
    batch_size: int,
) -> list[dict[str, torch.Tensor]]:
    """Training batches captured online from an HF target (tests, benchmarks): the batch dict of the brief.

    ``sequences`` are ``(input_ids, loss_mask)`` pairs; ``layer_ids`` are HF ``hidden_states`` indices (the
    ``input_of_layer`` convention); ``last_hidden`` is ``hidden_states[-1]``, the post-norm input of ``lm_head``.
    Right padding with id 0 and ``attention_mask`` False on padding.
    """
    batches = []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width)
        attn = torch.zeros(len(chunk), width, dtype=torch.bool)
        for row, (seq, loss) in enumerate(chunk):
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = torch.tensor(loss, dtype=torch.float32)
            attn[row, : len(seq)] = True
        out = target(input_ids=ids, attention_mask=attn.long(), output_hidden_states=True)
        aux = torch.cat([out.hidden_states[i] for i in layer_ids], dim=-1)  # 3 x [B, T, H] -> [B, T, 3H]
        batches.append({"input_ids": ids, "loss_mask": mask, "attention_mask": attn,
                        "aux_hidden": aux.float(), "last_hidden": out.hidden_states[-1].float()})
    return batches
