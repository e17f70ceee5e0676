"""Capture backends by name (a registry): ``hf`` (transformers, in-process) and ``sglang`` (the
target as SGLang serves it, in SGLang's own model runner: ``eagle3.capture.sglang``).

A backend turns batches of token ids into per-sample hidden states. Everything else (bucketing,
quarantine, encoding, Parquet, resume) lives in ``eagle3.capture.shard`` and is shared by every
backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import torch

from eagle3.capture.encoding import FinalCodec, TopKCodec
from eagle3.capture.head import target_topk

if TYPE_CHECKING:
    from eagle3.config.pipeline import PipelineConfig


class TopK(NamedTuple):
    """The target's top-k next-token distribution after each token, as a backend that computes it
    hands it over: ``ids [T, k]`` (integers) and full-vocab softmax ``probs [T, k]``, by descending
    probability."""

    ids: torch.Tensor
    probs: torch.Tensor


@runtime_checkable
class CaptureBackend(Protocol):
    """Turns a batch of token-id lists into, per sample and in order, ``(aux [T, 3H], final)``.

    ``aux`` holds the residual stream entering the configured layers (``input_of_layer``, HF
    ``output_hidden_states[i]``), concatenated low|mid|high. ``final`` is the final post-norm state
    ``[T, H]`` (the input of ``lm_head``), or, from a backend that computes the ``fp8_topk``
    encoding's distribution itself (the SGLang ranks, over their vocab shards), a ``TopK``. Tensors
    may live on any device; the caller copies them to the host without waiting for them and reads
    them on its writer thread, while the next forward runs, so a backend returns tensors that later
    forwards do not overwrite (no reused output buffers).
    """

    hidden_size: int

    def forward(
        self, batch_ids: list[list[int]]
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor | TopK]]: ...


@runtime_checkable
class HeadBackend(CaptureBackend, Protocol):
    """A backend that returns final states and exposes the target's output head ``[V, H]`` on the
    device they come out on: the ``fp8_topk`` encoding turns them into the top-k with it
    (``eagle3.capture.head``)."""

    @property
    def lm_head(self) -> torch.Tensor: ...


def check_shapes(
    n: int, aux: torch.Tensor, final: torch.Tensor | TopK, *, hidden_size: int, codec: FinalCodec
) -> None:
    """A backend's states for an ``n``-token sample: ``aux [n, 3H]``, ``final [n, H]`` or a ``TopK``
    of ``[n, k]``."""
    width = codec.k if isinstance(final, TopK) and isinstance(codec, TopKCodec) else hidden_size
    final_shape = tuple(final.ids.shape) if isinstance(final, TopK) else tuple(final.shape)
    if tuple(aux.shape) != (n, 3 * hidden_size) or final_shape != (n, width):
        raise ValueError(
            f"capture backend returned aux {tuple(aux.shape)} / final {final_shape} for a {n}-token sample; "
            f"expected ({n}, {3 * hidden_size}) / ({n}, {width}): check target.hidden_size"
        )


def stored_final(
    codec: FinalCodec, final: torch.Tensor | TopK, backend: CaptureBackend
) -> tuple[torch.Tensor, ...]:
    """The final-state column's stored form: the state, or (``fp8_topk``) the target's top-k
    next-token distribution, as the backend computed it or from the state with the backend's
    ``lm_head`` on its device."""
    if not isinstance(codec, TopKCodec):
        if isinstance(final, TopK):
            raise TypeError(
                f"{type(backend).__name__} returned a top-k where the encoding stores the final state"
            )
        return codec.stored(final)
    if isinstance(final, TopK):
        return codec.stored(final.ids, final.probs)
    if not isinstance(backend, HeadBackend):
        raise TypeError(
            f"{type(backend).__name__} returns final states but has no lm_head for capture.encoding=fp8_topk"
        )
    return codec.stored(*target_topk(final, backend.lm_head, codec.k))


BackendFactory = Callable[["PipelineConfig"], CaptureBackend]

_REGISTRY: dict[str, BackendFactory] = {}


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
    """Decorator registering ``factory(config) -> CaptureBackend`` under ``name``; a duplicate is an
    error."""

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
        raise KeyError(
            f"unknown capture backend {name!r}: set capture.backend to one of {sorted(_REGISTRY)}"
        )
    return _REGISTRY[name]


def make_backend(config: PipelineConfig) -> CaptureBackend:
    return get_backend(config.capture.backend)(config)


def _load_builtin() -> None:
    """Import the modules that register the built-in backends (kept lazy: they import
    transformers)."""
    import eagle3.capture.hf
    import eagle3.capture.sglang.backend  # noqa: F401
