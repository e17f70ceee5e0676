"""Capture backends by name (STYLE §7): ``hf`` (transformers, in-process) now, an in-process SGLang one later.

A backend turns batches of token ids into per-sample hidden states. Everything else (bucketing, quarantine,
Parquet, resume) lives in ``eagle3.capture.run`` and is shared by every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from eagle3.config import PipelineConfig


@runtime_checkable
class CaptureBackend(Protocol):
    """Turns a batch of token-id lists into, per sample and in order, ``(aux [T, 3H], last [T, H])``.

    ``aux`` holds the residual stream entering the configured layers (``input_of_layer``, HF
    ``output_hidden_states[i]``), concatenated low|mid|high; ``last`` is the final post-norm state (the input of
    ``lm_head``). Tensors may live on any device; the caller copies them to the host without waiting for them and
    reads them on its writer thread, while the next forward runs, so a backend returns tensors that later forwards
    do not overwrite (no reused output buffers). ``lm_head`` is the target's output head ``[V, H]`` on the device
    ``last`` comes out on: the ``fp8_topk`` encoding turns ``last`` into the target's top-k next-token distribution
    with it (``eagle3.capture.head``), so an in-process SGLang backend exposes its (gathered) head too.
    """

    hidden_size: int

    @property
    def lm_head(self) -> torch.Tensor: ...

    def forward(self, batch_ids: list[list[int]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...


BackendFactory = Callable[["PipelineConfig"], CaptureBackend]

_REGISTRY: dict[str, BackendFactory] = {}


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
    """Decorator registering ``factory(config) -> CaptureBackend`` under ``name``; a duplicate is an error."""

    def decorate(factory: BackendFactory) -> BackendFactory:
        if name in _REGISTRY:
            raise ValueError(f"capture backend {name!r} is already registered; pick another name")
        _REGISTRY[name] = factory
        return factory

    return decorate


def known_backends() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_backend(name: str) -> BackendFactory:
    """The factory registered as ``name``; an unknown name lists the known ones."""
    _load_builtin()
    if name not in _REGISTRY:
        raise KeyError(f"unknown capture backend {name!r}: set capture.backend to one of {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def make_backend(config: PipelineConfig) -> CaptureBackend:
    return get_backend(config.capture.backend)(config)


def _load_builtin() -> None:
    """Import the modules that register the built-in backends (kept lazy: they import transformers)."""
    import eagle3.capture.hf  # noqa: F401
