"""An online-training world: regen shards of the tiny world, their captured feature shards (the
stored path's input, captured by the hf backend), a draft vocab, and a config small enough for a few
seconds of CPU training."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig


def _regen_rows(tokenizer, n: int, *, seed: int) -> list[dict]:
    from eagle3.data.template import render_conversation
    from eagle3.worlds.conversations import generate_conversations

    rows = []
    for conv in generate_conversations(n, seed=seed):
        r = render_conversation(tokenizer, conv)
        rows.append(
            {
                "sample_id": hashlib.sha256(r.text.encode()).hexdigest()[:16],
                "source": "t",
                "messages": conv,
                "input_ids": r.input_ids,
                "loss_mask": r.loss_mask,
                "status": "ok",
            }
        )
    return rows


def online_config(model_dir: Path, root: Path, *overrides: str) -> PipelineConfig:
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_dir)
    base = PipelineConfig(
        name="online-test",
        root=str(root),
        target=TargetConfig(
            model_path=str(model_dir),
            num_layers=hf.num_hidden_layers,
            hidden_size=hf.hidden_size,
            vocab_size=hf.vocab_size,
            context_length=1024,
            dtype="float32",
        ),
    )
    return with_overrides(
        base,
        [
            "capture.dtype=float32",
            "capture.batch_tokens=2048",
            "capture.max_seq_len=1024",
            "capture.row_group_bytes=262144",
            "vocab.draft_vocab_size=256",
            "train.precision=fp32",
            "train.device=cpu",
            "train.lr=3e-3",
            "train.batch_size=4",
            "train.log_every=1",
            "train.save_every=4",
            "train.ttt_steps=3",
            "train.epochs=2",
            "train.online.max_inflight=3",
            *overrides,
        ],
    )


@pytest.fixture(scope="session")
def online_world(tiny_world, tiny_tokenizer, tmp_path_factory):
    """Two regen shards (14 and 10 conversations), their features captured by hf (the stored path),
    a vocab."""
    import torch

    from eagle3.capture.manifest import finalize_features
    from eagle3.capture.shard import capture_shard, features_fingerprint, read_regen_shard
    from eagle3.data.parquet import ShardWriter
    from eagle3.regen.schema import REGEN_SCHEMA
    from eagle3.worlds.distil import write_draft_vocab

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("online-root")
    model_dir = Path(tiny_world.model_dir)
    regen = root / "regen" / "fp-online-regen"
    for index, (n, seed) in enumerate([(14, 21), (10, 22)]):
        with ShardWriter(regen, REGEN_SCHEMA, start_index=index) as writer:
            writer.write_rows(_regen_rows(tiny_tokenizer, n, seed=seed))
    from eagle3.regen.plan import RegenPlan
    from eagle3.rundir.layout import PLAN_FILE
    from eagle3.rundir.runroot import atomic_write_text

    plan = RegenPlan(
        stage="regen",
        fingerprint=regen.name,
        out_dir=regen,
        units=(0, 1),
        prompts_dir=regen,
        prompts_fingerprint="",
        shards={0: 14, 1: 10},
    )
    # planned, as a regen stage always is
    atomic_write_text(regen / PLAN_FILE, plan.model_dump_json())
    config = online_config(model_dir, root)
    # not at the features stage directory of this root (``features/<fp>``): an online run there
    # would read them
    features = root / "stored" / features_fingerprint(config, regen.name)
    for shard in sorted(regen.glob("shard-*.parquet")):
        capture_shard(config, shard, features)
    finalize_features(config, features, [0, 1])
    samples = [
        s for shard in sorted(regen.glob("shard-*.parquet")) for s in read_regen_shard(shard)
    ]
    vocab = write_draft_vocab(
        [(s.input_ids, s.loss_mask) for s in samples],
        vocab_size=config.target.vocab_size,
        draft_vocab_size=256,
        path=root / "vocab.safetensors",
    )
    return SimpleNamespace(
        root=root,
        model_dir=model_dir,
        regen=regen,
        features=features,
        vocab=vocab,
        config=config,
        samples=samples,
    )
