"""Full training state on disk without pickle: safetensors for tensors, JSON for everything else.

Layout: ``<out>/ckpt/step-NNNNNN/`` holding ``model.safetensors`` (draft weights, export key names),
``optimizer.safetensors`` + ``optimizer.json`` (the optimizer state tree with tensors replaced by
references), ``trainer.json`` (step, scheduler, metrics, draft config) and ``rank-R.json`` per rank
(RNG states of python, numpy, torch (+cuda) as base64/lists, and that rank's data-loader position).
A checkpoint is written into ``.tmp-step-NNNNNN`` and renamed into place, then the ``latest``
pointer file is replaced atomically, then all but the newest ``keep_last`` checkpoints are deleted.
A kill at any moment leaves ``latest`` naming a complete checkpoint (or no checkpoint at all).
Nothing here unpickles: loading is ``safetensors`` + ``json``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from eagle3.rundir.runroot import atomic_write_json, atomic_write_text, fsync_dir

logger = logging.getLogger(__name__)

LATEST = "latest"
_TENSOR = "__tensor__"
_TUPLE = "__tuple__"


def flatten_tensors(tree: Any, prefix: str = "t") -> tuple[Any, dict[str, torch.Tensor]]:
    """Replace every tensor in a nested dict/list/tuple by ``{"__tensor__": key}``; return
    (structure, tensors)."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            key = f"{path}"
            tensors[key] = node.detach().cpu().contiguous()
            return {_TENSOR: key}
        if isinstance(node, dict):
            return {str(k): walk(v, f"{path}/{k}") for k, v in node.items()}
        if isinstance(node, tuple):
            return {_TUPLE: [walk(v, f"{path}/{i}") for i, v in enumerate(node)]}
        if isinstance(node, list):
            return [walk(v, f"{path}/{i}") for i, v in enumerate(node)]
        return node

    return walk(tree, prefix), tensors


def unflatten_tensors(structure: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(structure, dict):
        if _TENSOR in structure:
            return tensors[structure[_TENSOR]]
        if _TUPLE in structure:
            return tuple(unflatten_tensors(v, tensors) for v in structure[_TUPLE])
        return {k: unflatten_tensors(v, tensors) for k, v in structure.items()}
    if isinstance(structure, list):
        return [unflatten_tensors(v, tensors) for v in structure]
    return structure


def _b64(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode()


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def rng_state() -> dict[str, Any]:
    """RNG states of python, numpy and torch (+ every CUDA device) as JSON-safe values."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


@dataclass
class Checkpoint:
    path: Path
    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    trainer: dict[str, Any]
    rank_state: dict[str, Any]


def step_dir(ckpt_root: Path, step: int) -> Path:
    return Path(ckpt_root) / f"step-{step:06d}"


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    *,
    model: dict[str, torch.Tensor] | None,
    optimizer: dict[str, Any] | None,
    trainer: dict[str, Any] | None,
    rank_state: dict[str, Any],
    rank: int = 0,
    keep_last: int = 3,
    barrier: Callable[[], None] = lambda: None,
) -> Path:
    """Write one checkpoint collectively: every rank writes its ``rank-R.json``; rank 0 the rest and
    the pointer.

    ``model``/``optimizer``/``trainer`` are the full (gathered) states, needed on rank 0 only.
    """
    ckpt_root = Path(ckpt_root)
    final, tmp = step_dir(ckpt_root, step), ckpt_root / f".tmp-step-{step:06d}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    atomic_write_json(tmp / f"rank-{rank}.json", rank_state)
    if rank == 0:
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in (model or {}).items()},
            str(tmp / "model.safetensors"),
        )
        structure, tensors = flatten_tensors(optimizer or {})
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        atomic_write_json(tmp / "optimizer.json", structure)
    barrier()
    if rank == 0:
        atomic_write_json(tmp / "trainer.json", {"step": step, **(trainer or {})})
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(ckpt_root)
        atomic_write_text(ckpt_root / LATEST, final.name + "\n")
        _prune(ckpt_root, keep_last)
        logger.info("checkpoint %s written", final)
    barrier()
    return final


def _prune(ckpt_root: Path, keep_last: int) -> None:
    steps = sorted(p for p in ckpt_root.glob("step-*") if p.is_dir())
    for old in steps[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The checkpoint the ``latest`` pointer names, or None when there is none (a fresh run)."""
    pointer = Path(ckpt_root) / LATEST
    if not pointer.exists():
        return None
    path = Path(ckpt_root) / pointer.read_text().strip()
    if not (path / "trainer.json").exists():
        raise FileNotFoundError(
            f"{pointer} names {path}, which is incomplete: delete {pointer} to start over"
        )
    return path


def load_checkpoint(path: Path, *, rank: int = 0) -> Checkpoint:
    path = Path(path)
    trainer = json.loads((path / "trainer.json").read_text())
    structure = json.loads((path / "optimizer.json").read_text())
    optimizer = unflatten_tensors(structure, load_file(str(path / "optimizer.safetensors")))
    rank_file = path / f"rank-{rank}.json"
    if not rank_file.exists():
        raise FileNotFoundError(
            f"{rank_file} missing: resume with the same number of processes as the checkpoint"
        )
    return Checkpoint(
        path=path,
        step=int(trainer["step"]),
        model=load_file(str(path / "model.safetensors")),
        optimizer=optimizer,
        trainer=trainer,
        rank_state=json.loads(rank_file.read_text()),
    )


def full_states(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, sharded: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Full model and optimizer state, gathered from the ranks when ``sharded`` (FSDP); the
    optimizer's is keyed by parameter name (the format DCP uses for FSDP)."""
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict as get_optim

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        optim_state = get_optim(model, optimizer, options=options)
        return get_model_state_dict(model, options=options), optim_state
    names = [name for name, _ in model.named_parameters()]
    optim = optimizer.state_dict()
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in optim["param_groups"]]
    state = {names[i]: v for i, v in optim["state"].items()}
    return model.state_dict(), {"state": state, "param_groups": groups}


def load_full_states(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, Any],
    optim_state: dict[str, Any],
    *,
    sharded: bool,
) -> None:
    """Load what ``full_states`` returned (into each rank's shards when ``sharded``)."""
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict as set_optim

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        set_model_state_dict(model, model_state, options=options)
        set_optim(model, optimizer, optim_state, options=options)
        return
    index = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    model.load_state_dict(model_state)
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in optim_state["param_groups"]]
    state = {index[name]: v for name, v in optim_state["state"].items()}
    optimizer.load_state_dict({"state": state, "param_groups": groups})
