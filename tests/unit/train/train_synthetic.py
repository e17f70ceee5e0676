"""Synthetic draft-training inputs (random target head, features and masks) shared by the DDP and
resume tests and their subprocess scripts; small enough to train in seconds on one CPU thread."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from eagle3.capture.encoding import TopKCodec, column_codecs, encoding_topk
from eagle3.capture.head import target_topk
from eagle3.capture.schema import FEATURE_SCHEMA, feature_table, footer_metadata
from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.data.parquet import ShardWriter
from eagle3.model.draft import DraftConfig
from eagle3.model.target_weights import TargetHead
from eagle3.train.identity import DraftInputs

H, V, VD, B, T = 32, 64, 16, 4, 12
# k of the fp8_topk features: a quarter of the vocab, so some of the distribution is dropped
TOPK = 16


def synthetic(
    steps_per_epoch: int = 4, **overrides: object
) -> tuple[PipelineConfig, DraftInputs, list[dict]]:
    """(config, inputs, global batches); ``overrides`` are config keys, e.g.
    ``**{"train.save_every": 3}``."""
    g = torch.Generator().manual_seed(0)
    target = SimpleNamespace(
        hidden_size=H,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        # no transformers import
        vocab_size=V,
        max_position_embeddings=128,
        rope_theta=10000.0,
    )
    head = TargetHead(
        embed=torch.randn(V, H, generator=g), lm_head=torch.randn(V, H, generator=g), tied=False
    )
    draft_ids = torch.arange(0, V, V // VD)
    inputs = DraftInputs(
        DraftConfig.from_target_config(target, draft_vocab_size=VD),
        head,
        draft_ids - torch.arange(VD),
    )
    batches = []
    for _ in range(steps_per_epoch):
        lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
        attn = torch.arange(T)[None] < lengths[:, None]
        batches.append(
            {
                "input_ids": torch.randint(0, V, (B, T), generator=g) * attn,
                "loss_mask": (torch.rand(B, T, generator=g) > 0.3).float() * attn,
                "attention_mask": attn,
                "aux_hidden": torch.randn(B, T, 3 * H, generator=g),
                "last_hidden": torch.randn(B, T, H, generator=g),
            }
        )
    config = with_overrides(
        PipelineConfig(
            name="t",
            root="/tmp",
            target=TargetConfig(model_path="x", num_layers=8, hidden_size=H, vocab_size=V),
        ),
        [
            "train.device=cpu",
            "train.precision=fp32",
            "train.ttt_steps=3",
            "train.lr=1e-2",
            "train.epochs=3",
            "train.log_every=1",
            "train.warmup_ratio=0.1",
            *[f"{k}={v}" for k, v in overrides.items()],
        ],
    )
    return config, inputs, batches


def write_features(
    batches: list[dict], out_dir: Path, encoding: str, lm_head: torch.Tensor
) -> list[Path]:
    """The batches' rows, in order, as one bf16 feature shard in ``encoding`` (for
    ``FeatureDataset``); ``fp8_topk`` stores the top-``TOPK`` of ``lm_head``'s distribution, as
    capture does."""
    aux_codec, last_codec = column_codecs(encoding, "bfloat16", H, topk=TOPK)
    rows: list[dict] = []
    for batch in batches:
        for i in range(batch["input_ids"].shape[0]):
            n = int(batch["attention_mask"][i].sum())
            last = batch["last_hidden"][i, :n]
            rows.append(
                {
                    "sample_id": f"r{len(rows)}",
                    "input_ids": batch["input_ids"][i, :n].tolist(),
                    "loss_mask": batch["loss_mask"][i, :n].int().tolist(),
                    "seq_len": n,
                    "aux_hidden": aux_codec.encode(batch["aux_hidden"][i, :n]),
                    "last_hidden": last_codec.encode(*target_topk(last, lm_head, TOPK))
                    if isinstance(last_codec, TopKCodec)
                    else last_codec.encode(last),
                }
            )
    meta = footer_metadata(
        target_model="x",
        target_revision=None,
        hidden_size=H,
        num_layers=8,
        layer_ids=[2, 4, 5],
        dtype="bfloat16",
        encoding=encoding,
        chat_template_hash="-",
        system_prompt_policy="keep",
        truncation="quarantine",
        max_seq_len=T,
        features_fingerprint="synthetic",
        topk=encoding_topk(encoding, TOPK),
    )
    with ShardWriter(out_dir, FEATURE_SCHEMA, metadata=meta) as writer:
        writer.write_table(feature_table(rows))
        return [info.path for info in writer.close()]
