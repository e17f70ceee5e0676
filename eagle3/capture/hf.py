"""The ``hf`` capture backend: the target loaded with transformers, forward passes with hidden
states.

* Aux states: ``output_hidden_states[i]`` for ``i`` in ``config.sglang_layer_ids`` (the residual
  stream entering layer ``i``, pre-norm; SGLang's capture convention), concatenated low|mid|high to
  ``[T, 3H]``.
* Final state: the *input of* ``lm_head``, captured with a forward pre-hook. That is post-norm for
  every architecture, whereas ``hidden_states[-1]`` is post-norm only where the model happens to
  apply its norm before recording (HF Llama does, others differ). The hook also hands ``lm_head``
  only the last position, so the forward never materialises ``[B, T, vocab]`` logits (163K-wide for
  Kimi) that capture does not need.
* Batches are right-padded with an attention mask; with causal attention, padding never changes the
  states of the real tokens, so rows are sliced back to their own length.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from eagle3.capture.backends import register_backend
from eagle3.capture.budget import human_bytes
from eagle3.capture.encoding import TORCH_DTYPES
from eagle3.capture.footprint import capture_footprint, check_fits, free_bytes
from eagle3.config.capture import DEVICE_MAP_STRATEGIES
from eagle3.target_io import load_causal_lm

if TYPE_CHECKING:
    from eagle3.config.pipeline import PipelineConfig

logger = logging.getLogger(__name__)


class HFBackend:
    """Hidden-state capture from a transformers causal LM (already loaded; see
    ``load_hf_backend``)."""

    def __init__(
        self, model: nn.Module, layer_ids: Sequence[int], *, hidden_size: int | None = None
    ) -> None:
        self.model = model.eval()
        self.layer_ids = list(layer_ids)
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.hidden_size = int(text_config.hidden_size)
        self.num_layers = int(text_config.num_hidden_layers)
        if hidden_size is not None and hidden_size != self.hidden_size:
            raise ValueError(
                f"target.hidden_size={hidden_size} but the loaded model has hidden_size={self.hidden_size}: "
                "fix target.hidden_size in the config"
            )
        bad = [i for i in self.layer_ids if not 0 <= i <= self.num_layers]
        if bad:
            raise ValueError(
                f"aux layer ids {bad} out of range for a {self.num_layers}-layer model"
            )
        self._head = model.get_output_embeddings()
        if self._head is None:
            raise ValueError(
                f"{type(model).__name__} has no lm_head (get_output_embeddings() is None)"
            )
        offloaded = offloaded_modules(model)
        if offloaded:
            raise ValueError(
                f"the target does not fit on its devices: device_map offloaded {len(offloaded)} modules to CPU or "
                f"disk ({', '.join(offloaded[:4])}{', ...' if len(offloaded) > 4 else ''}). Capture would stream "
                "their weights at every forward, and lm_head's weight is not resident for the top-k encoding. "
                "Make it fit: more or larger GPUs (all visible ones are used: CUDA_VISIBLE_DEVICES), or a smaller "
                "checkpoint of the target"
            )
        self._captured: list[torch.Tensor] = []
        self._lock = threading.Lock()
        self.device = next(model.parameters()).device

    @property
    def lm_head(self) -> torch.Tensor:
        """The target's output head ``[V, H]`` (tied or not), where the model keeps it (``last`` is
        its input)."""
        return self._head.weight

    def _grab_lm_head_input(self, _module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]
        self._captured.append(hidden)
        # [B, T, H] -> [B, 1, H]: skip logits capture does not need
        return (hidden[..., -1:, :], *args[1:])

    @torch.inference_mode()
    def forward(self, batch_ids: list[list[int]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Per sample, in order: ``(aux [T, 3H], last [T, H])`` on the model's device."""
        lengths = [len(ids) for ids in batch_ids]
        width = max(lengths)
        input_ids = torch.zeros(len(batch_ids), width, dtype=torch.long)
        attention = torch.zeros(len(batch_ids), width, dtype=torch.long)
        for b, ids in enumerate(batch_ids):
            input_ids[b, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention[b, : len(ids)] = 1
        with self._lock:  # shard tasks in threads share one model; the hook's buffer is per forward
            self._captured.clear()
            # only while we forward
            hook = self._head.register_forward_pre_hook(self._grab_lm_head_input)
            try:
                out = self.model(
                    input_ids=input_ids.to(self.device),
                    attention_mask=attention.to(self.device),
                    output_hidden_states=True,
                    use_cache=False,
                )
            finally:
                hook.remove()
            if len(self._captured) != 1:
                raise RuntimeError(
                    f"lm_head ran {len(self._captured)} times in one forward; expected exactly once"
                )
            last = self._captured.pop()
        states = out.hidden_states
        if len(states) != self.num_layers + 1:
            raise RuntimeError(
                f"model returned {len(states)} hidden states, expected {self.num_layers + 1}"
            )
        # 3 x [B, T, H] -> [B, T, 3H]; spread over GPUs (device_map), each layer's state lives on
        # its layer's GPU
        aux = torch.cat([states[i].to(self.device) for i in self.layer_ids], dim=-1)
        for b, n in enumerate(lengths):
            yield aux[b, :n], last[b, :n]


def offloaded_modules(model: nn.Module) -> list[str]:
    """The modules accelerate keeps off the devices (CPU or disk offload under a ``device_map``:
    their parameters are on ``meta`` and their weights loaded at each forward), named as the device
    map names them."""
    groups = getattr(model, "hf_device_map", None) or {}
    names = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    return sorted(
        {
            next((k for k in groups if name.startswith(f"{k}.")), name.rsplit(".", 1)[0])
            for name in names
        }
    )


def load_hf_backend(config: PipelineConfig) -> HFBackend:
    """Load ``config.target`` with transformers in ``config.capture.dtype`` on
    ``config.capture.device``.

    ``capture.device`` is one device (``cpu``, ``cuda``, ``cuda:1``) or a ``device_map`` strategy
    (``auto``, ``balanced``, ...) that spreads a target too large for one GPU over all visible ones;
    transformers does that with ``accelerate``, the ``multigpu`` extra, checked here so a missing
    package fails before the model loads. A target whose loaded size (``eagle3.capture.footprint``:
    compressed-tensors weights decompressed) exceeds the free memory there is refused before it
    loads."""
    target, capture = config.target, config.capture
    spread = capture.device in DEVICE_MAP_STRATEGIES
    if spread and importlib.util.find_spec("accelerate") is None:
        raise RuntimeError(
            f"capture.device={capture.device!r} spreads the target over GPUs with transformers' device_map, which "
            "needs accelerate: pip install 'eagle3-pipeline[multigpu]', or set capture.device to one device (cuda)"
        )
    footprint = capture_footprint(config)
    free = free_bytes(capture.device)
    logger.info(
        "loading %s (%s) on %s for capture: %s of weights and one batch's states, %s free",
        target.model_path,
        capture.dtype,
        capture.device,
        human_bytes(footprint.total),
        human_bytes(free),
    )
    check_fits(footprint, free, config=config)
    device_map = capture.device if spread else None
    model = load_causal_lm(target, dtype=TORCH_DTYPES[capture.dtype], device_map=device_map)
    if not spread:
        model = model.to(capture.device)
    return HFBackend(model, config.sglang_layer_ids, hidden_size=target.hidden_size)


@register_backend("hf")
def _hf_factory(config: PipelineConfig) -> HFBackend:
    return load_hf_backend(config)
