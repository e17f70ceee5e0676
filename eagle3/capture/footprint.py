"""The memory a target takes once transformers has loaded it for capture, read from its checkpoint's
safetensors headers before any weight is loaded, and the check that it fits the capture's devices.

Why here and not after the load: transformers keeps a compressed-tensors checkpoint compressed while
it loads and places it (Kimi-K2.5's INT4 experts, ``pack-quantized``: eight 4-bit weights per int32
plus a bf16 scale per group of 32), then decompresses every quantized weight to the load dtype at
the first forward (compressed-tensors' ``ct_decompress_hook``). A ``device_map`` is sized for the
compressed weights (~0.6 TB for Kimi-K2.5), nothing is offloaded, and the first batch needs ~2.1 TB:
an out-of-memory after the whole load, which ``HFBackend``'s offload check cannot see. So the
estimate counts what the model becomes:

    weights     = every floating tensor in capture.dtype, a pack-quantized weight at its dense shape in
                  capture.dtype, a compressed-tensors fp8 weight in capture.dtype, anything else as
                  stored
    activations = capture.batch_tokens x hidden x (num_layers + 1) x capture.dtype bytes
                  (output_hidden_states keeps every layer's state of the batch until the forward
                  ends)

and ``load_hf_backend`` refuses when it exceeds the free memory of the devices capture uses (the
visible GPUs for a ``device_map`` strategy, the one GPU for ``cuda:N``, available RAM for ``cpu``).
Checkpoints in other quantized formats (``quant_method: fp8``, DeepSeek's block fp8) are counted as
stored: transformers keeps them fp8 on a GPU.

``capture.backend=sglang`` holds the target as SGLang serves it: quantized weights stay in their
served format (INT4 ``pack-quantized`` experts, NVFP4, fp8), so its plan (``served_plan``, per GPU)
is

    weights  = the checkpoint as stored / tensor-parallel ranks   (headers, else target.checkpoint_bytes)
    buffers  = max(batch_tokens, max_seq_len) x 4H x capture.dtype bytes   (every rank's aux + final states)
             + fp8_topk's logits chunk over the rank's vocab shard (float32, and its softmax)

and the SGLang backend refuses before any worker starts when that exceeds the smallest free GPU of
its ranks (RAM for all ranks on a CPU). Approximations, said here once: SGLang replicates a few
small tensors on every rank (norms, routers, MLA's latent projections: ~2 GB at Kimi-K2.5's shape)
that the split spreads, and the batch's KV and the forward's activations live inside SGLang's own
``--mem-fraction-static`` accounting, which it checks itself at load.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import safe_open

from eagle3.capture.budget import human_bytes
from eagle3.capture.encoding import TORCH_DTYPES
from eagle3.config.capture import DEVICE_MAP_STRATEGIES, sglang_ranks
from eagle3.config.pipeline import PipelineConfig
from eagle3.model.target_weights import INDEX, SINGLE

logger = logging.getLogger(__name__)
STORED_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
FLOATS = {"F64", "F32", "F16", "BF16"}


class CaptureMemoryError(RuntimeError):
    """The target, loaded for capture, would not fit the capture's devices (the message has both
    sizes)."""


@dataclass(frozen=True)
class Footprint:
    """Bytes the loaded target takes on the capture's devices (see the module docstring)."""

    weights: int
    activations: int
    stored: int  # the checkpoint's own size, for the message
    quant_method: str | None

    @property
    def total(self) -> int:
        return self.weights + self.activations


def headers(model_path: str, revision: str | None) -> dict[str, tuple[str, list[int]]]:
    """``tensor name -> (safetensors dtype, shape)`` of a checkpoint, from the file headers only (a
    local directory's files, or the Hub's header ranges: no weight is read or downloaded)."""
    local = _local_checkpoint(model_path, revision)
    if local is None:
        from huggingface_hub import get_safetensors_metadata

        try:
            meta = get_safetensors_metadata(model_path, revision=revision)
        # the network's errors (httpx's are not OSErrors), a gated or missing repo
        except Exception as exc:
            raise OSError(
                f"the Hub's safetensors headers of {model_path}: {type(exc).__name__}: {exc}"
            ) from exc
        return {
            name: (info.dtype, list(info.shape))
            for file in meta.files_metadata.values()
            for name, info in file.tensors.items()
        }
    files = _shard_files(local)
    if not files:
        raise FileNotFoundError(
            f"{local} has neither {INDEX} nor {SINGLE}: point target.model_path at a checkpoint"
        )
    out: dict[str, tuple[str, list[int]]] = {}
    for name in files:
        # parses the header; no tensor is read
        with safe_open(str(local / name), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                part = fh.get_slice(key)
                out[key] = (part.get_dtype(), list(part.get_shape()))
    return out


def _shard_files(local: Path) -> list[str]:
    """The safetensors files of a checkpoint directory: its index's, or the single file; [] when it
    has neither."""
    if (local / INDEX).exists():
        return sorted(set(json.loads((local / INDEX).read_text())["weight_map"].values()))
    return [SINGLE] if (local / SINGLE).exists() else []


def _local_checkpoint(model_path: str, revision: str | None) -> Path | None:
    """The checkpoint's directory: ``model_path`` itself, or a Hub id's complete snapshot in the HF
    cache (so an offline node, ``HF_HUB_OFFLINE=1``, that loads from its cache is measured from it
    too); None when not here."""
    local = Path(model_path).expanduser()
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        local = Path(snapshot_download(model_path, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        return None
    files = _shard_files(local)
    return local if files and all((local / name).exists() for name in files) else None


def quantization_config(model_path: str, revision: str | None) -> dict[str, Any]:
    """The checkpoint's ``quantization_config`` (``{}`` for a dense one), from its
    ``config.json``."""
    local = _local_checkpoint(model_path, revision)
    if local is not None:
        path = local / "config.json"
    else:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(model_path, "config.json", revision=revision))
    config = json.loads(path.read_text())
    text = config.get("text_config") or {}
    return config.get("quantization_config") or text.get("quantization_config") or {}


def weight_bytes(
    tensors: dict[str, tuple[str, list[int]]], quant: dict[str, Any], dtype: str
) -> int:
    """What the tensors take once loaded in ``dtype`` and, for compressed-tensors, decompressed."""
    itemsize = TORCH_DTYPES[dtype].itemsize
    compressed = quant.get("quant_method") == "compressed-tensors"
    # a pack-quantized weight's bits per value: the smallest of its groups' (the largest dense
    # estimate)
    bits = min(
        (
            g["weights"]["num_bits"]
            for g in quant.get("config_groups", {}).values()
            if g.get("weights")
        ),
        default=4,
    )
    unknown = sorted({kind for kind, _ in tensors.values()} - STORED_BYTES.keys())
    if unknown:
        raise ValueError(
            f"the target's checkpoint stores tensors of dtype {unknown}, which capture cannot size"
        )
    total = 0
    for name, (kind, shape) in tensors.items():
        n = math.prod(shape)
        # int32 words of 32 // bits values along the input dim
        if compressed and name.endswith(".weight_packed"):
            total += n * (STORED_BYTES[kind] * 8 // bits) * itemsize
        elif kind in FLOATS or (compressed and kind.startswith("F8")):
            total += n * itemsize
        else:
            total += n * STORED_BYTES[kind]
    return total


def stored_bytes(tensors: dict[str, tuple[str, list[int]]]) -> int:
    """The checkpoint's bytes as stored (every tensor at its safetensors dtype)."""
    return sum(math.prod(shape) * STORED_BYTES[kind] for kind, shape in tensors.values())


def capture_footprint(config: PipelineConfig) -> Footprint:
    """The target of ``config`` as ``load_hf_backend`` would hold it, read from its checkpoint's
    headers."""
    target, capture = config.target, config.capture
    tensors = headers(target.model_path, target.revision)
    quant = quantization_config(target.model_path, target.revision)
    stored = stored_bytes(tensors)
    states = (
        capture.batch_tokens
        * target.hidden_size
        * (target.num_layers + 1)
        * TORCH_DTYPES[capture.dtype].itemsize
    )
    return Footprint(
        weights=weight_bytes(tensors, quant, capture.dtype),
        activations=states,
        stored=stored,
        quant_method=quant.get("quant_method"),
    )


def free_bytes(device: str) -> int:
    """Free memory where capture puts the target: every visible GPU for a ``device_map`` strategy
    (the CPU's when there is none: transformers then places the target there), the one GPU of
    ``cuda[:N]``, RAM for ``cpu``."""
    import psutil
    import torch

    if device in DEVICE_MAP_STRATEGIES and torch.cuda.is_available():
        return sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    return psutil.virtual_memory().available


def check_fits(footprint: Footprint, free: int, *, config: PipelineConfig) -> None:
    """Raise ``CaptureMemoryError`` when the loaded target and one batch's states exceed ``free``
    bytes."""
    capture = config.capture
    if footprint.total <= free:
        return
    how = (
        f"its {human_bytes(footprint.stored)} {footprint.quant_method} checkpoint is decompressed to "
        f"{capture.dtype} at the first forward, "
        if footprint.quant_method == "compressed-tensors"
        else ""
    )
    raise CaptureMemoryError(
        f"capture refused before loading {config.target.model_path}: {how}{human_bytes(footprint.weights)} of "
        f"weights in {capture.dtype} plus {human_bytes(footprint.activations)} of hidden states for "
        f"capture.batch_tokens={capture.batch_tokens:,} need {human_bytes(footprint.total)}, but "
        f"{human_bytes(free)} is free on capture.device={capture.device!r}. Use more or larger GPUs (a device_map "
        "strategy spreads over every visible one; capture.gpus reserves them on Ray), or lower capture.batch_tokens "
        "if the states are what does not fit"
    )


# eagle3.capture.sglang.worker.TOPK_CHUNK: logits rows per step of the ranks' top-k
TOPK_CHUNK_TOKENS = 2048


@dataclass(frozen=True)
class ServedPlan:
    """Per-GPU memory of ``capture.backend=sglang`` (module docstring); ``weights`` None: the size
    is unknown."""

    ranks: int
    weights: int | None
    buffers: int
    source: str

    @property
    def per_rank(self) -> int | None:
        return None if self.weights is None else self.weights + self.buffers

    def describe(self) -> dict[str, object]:
        """The plan as ``eagle3 config show`` prints it."""
        if self.weights is None:
            return {
                "ranks": self.ranks,
                "weights_per_gpu": f"unknown ({self.source})",
                "capture_buffers_per_gpu": human_bytes(self.buffers),
            }
        return {
            "ranks": self.ranks,
            "weights_per_gpu": human_bytes(self.weights),
            "capture_buffers_per_gpu": human_bytes(self.buffers),
            "per_gpu": human_bytes(self.weights + self.buffers),
            "weights_from": self.source,
        }


def served_plan(config: PipelineConfig) -> ServedPlan:
    """The SGLang capture's memory per rank, from the checkpoint's headers (local, cached, or the
    Hub's header ranges), else ``target.checkpoint_bytes``; no weight is read."""
    target, capture = config.target, config.capture
    ranks = sglang_ranks(capture, config.server.tp)
    try:
        stored, source = (
            stored_bytes(headers(target.model_path, target.revision)),
            "checkpoint headers",
        )
    except (OSError, ValueError) as exc:  # offline and not cached, gated, no safetensors
        stored = target.checkpoint_bytes
        source = (
            "target.checkpoint_bytes"
            if stored
            else f"headers unreadable ({exc}); set target.checkpoint_bytes"
        )
    tokens = max(capture.batch_tokens, capture.max_seq_len)
    buffers = tokens * 4 * target.hidden_size * TORCH_DTYPES[capture.dtype].itemsize
    if capture.encoding == "fp8_topk":
        buffers += 2 * TOPK_CHUNK_TOKENS * math.ceil(target.vocab_size / ranks) * 4
    return ServedPlan(
        ranks=ranks,
        weights=None if stored is None else math.ceil(stored / ranks),
        buffers=buffers,
        source=source,
    )


def free_gpu_bytes(device: str, ranks: int) -> int | None:
    """Free memory per rank: the smallest free GPU among the first ``ranks`` visible, RAM / ranks on
    a CPU; None when this process cannot see the GPUs (a CPU-only torch)."""
    import psutil
    import torch

    if device == "cpu":
        return psutil.virtual_memory().available // ranks
    if not torch.cuda.is_available():
        return None
    visible = torch.cuda.device_count()
    if visible < ranks:
        raise CaptureMemoryError(
            f"capture.backend=sglang runs {ranks} tensor-parallel ranks, one GPU each, but "
            f"{visible} GPU(s) are visible: lower capture.sglang.tp or make the node's GPUs "
            "visible (CUDA_VISIBLE_DEVICES, capture.gpus on Ray)"
        )
    return min(torch.cuda.mem_get_info(i)[0] for i in range(ranks))


def check_served_fits(plan: ServedPlan, free: int | None, *, config: PipelineConfig) -> None:
    """Raise ``CaptureMemoryError`` (both numbers) when a rank's weights and buffers exceed ``free``
    per rank."""
    need = plan.per_rank
    if need is None or free is None or need <= free:
        if need is None or free is None:
            logger.warning(
                "capture memory not checked before loading (weights %s, free %s): SGLang checks its own "
                "memory fraction at load",
                plan.source,
                "unknown" if free is None else human_bytes(free),
            )
        return
    capture = config.capture
    where = "of RAM per rank" if capture.device == "cpu" else "free on the smallest of its GPUs"
    raise CaptureMemoryError(
        f"capture refused before loading {config.target.model_path}: as SGLang serves it, its weights take "
        f"{human_bytes(plan.weights)} per GPU over {plan.ranks} tensor-parallel rank(s) ({plan.source}), plus "
        f"{human_bytes(plan.buffers)} of capture buffers for capture.batch_tokens={capture.batch_tokens:,}: "
        f"{human_bytes(need)} per GPU, but {human_bytes(free)} is {where}. Use more GPUs (capture.sglang.tp, "
        "capture.gpus), or lower capture.batch_tokens if the buffers are what does not fit"
    )
