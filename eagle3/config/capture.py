"""The ``capture`` section of the pipeline config.

Two backends (``capture.backend``, ``eagle3.capture.backends``): ``hf`` loads the target with
transformers in ``capture.dtype`` (on ``capture.device``: one device, or a ``device_map`` strategy
over every visible GPU); ``sglang`` runs the target as SGLang serves it, in SGLang's own model
runner, one process per tensor-parallel rank (``eagle3.capture.sglang``), with the settings of
``capture.sglang``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from eagle3.config.aux_layers import LAYER_CONVENTIONS, LayerConvention
from eagle3.config.base import StrictModel

# ``capture.device`` values that spread the target over every visible GPU with transformers'
# device_map.
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


class SGLangCaptureConfig(StrictModel):
    """How ``capture.backend=sglang`` loads the target: SGLang's own flags, as a server of the
    target would take them.

    ``tp`` None takes ``server.tp`` (the target as the pipeline serves it). Quantization is read
    from the checkpoint (Kimi-K2.5's INT4 compressed-tensors, an NVFP4 ModelOpt checkpoint) unless
    ``quantization`` names SGLang's ``--quantization``: the weights stay in the served format, never
    decompressed."""

    tp: int | None = Field(
        default=None, gt=0, description="--tp-size: one worker process per rank (None: server.tp)."
    )
    ep: int = Field(
        default=1,
        gt=0,
        description="--ep-size: expert parallel ranks among the tp ranks (MoE targets).",
    )
    quantization: str | None = Field(
        default=None,
        description="--quantization (None: what the checkpoint declares). "
        "Part of the features fingerprint: another quantization is another target.",
    )
    mem_fraction_static: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="--mem-fraction-static on GPUs (weights + the KV pool of one batch); None: SGLang's own choice.",
    )
    extra_args: list[str] = Field(
        default_factory=list, description="More SGLang server flags, passed as given."
    )
    start_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds the workers may take to load the "
        "target (a 1T-parameter checkpoint from a network disk takes tens of minutes).",
    )
    batch_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="Seconds one batch's forward may take before "
        "capture stops the workers and fails the shard (a hung collective).",
    )


class CaptureConfig(StrictModel):
    """Hidden-state capture. ``aux_layers`` empty means SGLang's default ``[2, L//2, L-3]``."""

    backend: str = Field(
        default="hf",
        description="A registered capture backend (eagle3.capture.backends): hf, transformers in capture.dtype; "
        "sglang, the target as SGLang serves it (capture.sglang), for targets no transformers process can hold "
        "(INT4/NVFP4 kept packed, tensor-parallel ranks).",
    )
    aux_layers: list[int] = Field(default_factory=list)
    layer_convention: LayerConvention = "input_of_layer"
    device: str = Field(
        default="cpu",
        description="cpu, cuda, cuda:N, or a device_map strategy (auto, ...) that "
        "spreads the target over every visible GPU (the multigpu extra). backend=sglang: cpu or cuda "
        "(rank r on the r-th visible GPU).",
    )
    gpus: int = Field(
        default=1,
        ge=1,
        description="GPUs a spread capture task holds on the Ray runner: the node's "
        "(8 for Kimi-K2.5); why in flows/runners.py. Single-device captures and threads ignore it.",
    )
    dtype: Literal["float32", "bfloat16"] = "bfloat16"
    batch_tokens: int = Field(default=16_384, gt=0)
    max_seq_len: int = Field(default=4096, gt=0)
    truncation: Literal["quarantine", "truncate"] = "quarantine"
    row_group_bytes: int = Field(
        default=64 * 2**20,
        gt=0,
        description="Uncompressed bytes per Parquet row group of a feature shard: the loader's unit of reading, "
        "shuffling and splitting over ranks. benchmarks/storage.py --row-group-mib 16,64 read neither size "
        "consistently faster (BENCHMARKS.md, 'Storage'); 64 MiB keeps the per-row-group overhead "
        "small.",
    )
    encoding: Literal["raw", "fp8_aux", "fp8_all", "fp8_topk"] = Field(
        default="raw",
        description="How hidden states are stored (eagle3.capture.encoding): raw in capture.dtype (8*H bytes per "
        "token in bf16), fp8_aux (aux states fp8 + per-token scales: ~5*H), fp8_all (final state too: ~4*H), "
        "fp8_topk (aux fp8, and the target's top-k next-token distribution instead of the final state: ~3*H + 6*k; "
        "the large recipes' default).",
    )
    topk: int = Field(
        default=256,
        description="k of the fp8_topk encoding: the target's k most likely next tokens (int32 id + float16 "
        "probability, 6 bytes each) stored per token; 1 <= k <= target.vocab_size. Ignored by other encodings. "
        "256 by benchmarks/learning.py on the tiny world: accept length 0.986 of raw (k=64: 0.973).",
    )
    hidden_compression: Literal["none", "lz4", "zstd"] = Field(
        default="zstd",
        description="Parquet codec of the two hidden-state columns (the others use zstd). Measured by "
        "benchmarks/storage.py (BENCHMARKS.md): zstd stores bf16 at 0.78 and fp8 at 0.82 of their size (the fp8 "
        "codes' entropy; higher levels gain nothing); lz4 saves nothing on either; none reads fastest.",
    )
    disk_reserve_bytes: int = Field(
        default=4 * 2**30,
        ge=0,
        description="Free space to keep at the features root beyond the capture estimate; capture refuses to "
        "start when free < estimate + reserve.",
    )
    shards_in_flight: int | None = Field(
        default=None,
        gt=0,
        description="Capture shards running at once (None: as many as the task runner runs); the disk budget "
        "reserves each one's part files (eagle3.capture.budget.shards_at_once).",
    )
    sglang: SGLangCaptureConfig = Field(default_factory=SGLangCaptureConfig)

    @field_validator("layer_convention", mode="before")
    @classmethod
    def _named_convention(cls, value: Any) -> Any:
        if value not in LAYER_CONVENTIONS:
            raise ValueError(
                f"unknown layer convention {value!r}: set capture.layer_convention to one of "
                f"{list(LAYER_CONVENTIONS)} ('input_of_layer' is SGLang's capture convention)"
            )
        return value

    @model_validator(mode="after")
    def _sglang_device(self) -> CaptureConfig:
        if self.backend == "sglang" and self.device not in ("cpu", "cuda"):
            raise ValueError(
                f"capture.device={self.device!r} with capture.backend=sglang: set capture.device to cuda (SGLang "
                "places rank r on the r-th visible GPU; capture.sglang.tp sets the ranks) or cpu"
            )
        return self


def sglang_ranks(capture: CaptureConfig, server_tp: int) -> int:
    """The tensor-parallel ranks ``capture.backend=sglang`` runs: ``capture.sglang.tp``, else
    ``server.tp``."""
    return capture.sglang.tp or server_tp


def check_capture_gpus(capture: CaptureConfig, server_tp: int) -> None:
    """An SGLang capture on CUDA holds one GPU per rank: on the Ray runner its task must ask for
    that many."""
    ranks = sglang_ranks(capture, server_tp)
    if capture.backend == "sglang" and capture.device == "cuda" and capture.gpus < ranks:
        raise ValueError(
            f"capture.backend=sglang runs {ranks} tensor-parallel ranks, one GPU each, but capture.gpus="
            f"{capture.gpus}: set capture.gpus={ranks} (what a Ray capture task holds)"
        )
    if ranks % capture.sglang.ep:
        raise ValueError(
            f"capture.sglang.ep={capture.sglang.ep} does not divide the {ranks} tensor-parallel ranks: "
            "set capture.sglang.ep to a divisor of capture.sglang.tp (SGLang's --ep-size)"
        )
