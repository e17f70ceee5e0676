"""The draft learns on the tiny world: loss falls, metrics/plot/checkpoints are written, the trained
draft's accept length beats the untrained one's on held-out prompts, and speculative output is
exactly the target's greedy decoding with either draft."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eagle3.config.pipeline import with_overrides
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder
from eagle3.train.checkpoint import save_checkpoint
from eagle3.train.distributed import DistInfo
from eagle3.train.export import export_draft
from eagle3.train.identity import load_inputs
from eagle3.train.trainer import build_draft, train_on_source
from eagle3.worlds.distil import ListBatchSource, greedy_answers

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
MAX_NEW = 40


@pytest.fixture(scope="module")
def trained(draft_world, tmp_path_factory):
    config = with_overrides(draft_world.config, ["train.epochs=3"])
    inputs = load_inputs(config, draft_world.vocab_path)
    out = tmp_path_factory.mktemp("trained")
    summary = train_on_source(
        config, ListBatchSource(draft_world.batches), inputs, out / "draft", CPU
    )
    untrained = out / "untrained"
    save_checkpoint(
        untrained / "ckpt",
        0,
        model=build_draft(inputs, config.train.seed).state_dict(),
        optimizer={},
        trainer={"draft_config": inputs.draft_config.to_dict()},
        rank_state={},
    )
    exports = {
        name: export_draft(config, out / src, draft_world.vocab_path, None, out / f"export-{name}")
        for name, src in (("trained", "draft"), ("untrained", "untrained"))
    }
    return summary, out / "draft", exports


@pytest.mark.slow
def test_training_loss_falls_and_writes_metrics_plot_and_checkpoint(trained):
    summary, out, _ = trained
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == summary["steps"] and len(records[0]["acc"]) == 4
    first, last = sum(r["loss"] for r in records[:3]) / 3, sum(r["loss"] for r in records[-3:]) / 3
    assert last < 0.8 * first
    assert records[-1]["accept_length_sim"] > records[0]["accept_length_sim"]
    assert (out / "training.png").stat().st_size > 0 and any((out / "tensorboard").iterdir())
    assert (out / "ckpt" / "latest").read_text().strip() == f"step-{summary['steps']:06d}"


@pytest.mark.slow
def test_trained_draft_accepts_more_and_both_drafts_decode_exactly_greedy(draft_world, trained):
    _, _, exports = trained
    prompts = draft_world.held_out[:20]
    reference = greedy_answers(
        draft_world.target,
        prompts,
        max_new_tokens=MAX_NEW,
        eos_id=draft_world.eos,
        pad_id=draft_world.tokenizer.pad_token_id,
        batch_size=1,
    )
    accept = {}
    for name, export in exports.items():
        decoder = SpeculativeDecoder(draft_world.target, draft_world.tokenizer, export, num_steps=3)
        tokens = passes = 0
        for prompt, expected in zip(prompts, reference, strict=True):
            output, verify, _, _ = decoder.generate(prompt, MAX_NEW, [draft_world.eos])
            assert output == expected
            tokens, passes = tokens + len(output), passes + verify
        accept[name] = tokens / passes
    # benchmarks/learning.py tracks the 1.5 goal
    assert accept["trained"] >= 1.3 * accept["untrained"], accept


def _held_out_features(
    draft_world, out_dir, rows: int = 4, *, encoding: str = "raw", topk: int = 1
):
    """A feature shard of held-out rows (target greedy answers, states captured online) in
    ``out_dir``, in ``encoding`` (``fp8_topk``: the target's top-``topk`` from its own ``lm_head``,
    as capture stores it)."""
    from eagle3.capture.encoding import TopKCodec, column_codecs, encoding_topk
    from eagle3.capture.head import target_topk
    from eagle3.capture.schema import FEATURE_SCHEMA, feature_table, footer_metadata
    from eagle3.data.parquet import ShardWriter
    from eagle3.worlds.distil import answer_sequences, batches_from_target

    prompts = draft_world.held_out[:rows]
    answers = greedy_answers(
        draft_world.target,
        prompts,
        max_new_tokens=MAX_NEW,
        eos_id=draft_world.eos,
        pad_id=draft_world.tokenizer.pad_token_id,
    )
    config = draft_world.config
    (batch,) = batches_from_target(
        draft_world.target,
        answer_sequences(prompts, answers),
        layer_ids=config.sglang_layer_ids,
        batch_size=rows,
    )
    aux_codec, last_codec = column_codecs(encoding, "float32", config.target.hidden_size, topk=topk)
    lm_head = draft_world.target.get_output_embeddings().weight.detach()
    table = []
    for i in range(rows):
        n = int(batch["attention_mask"][i].sum())
        last = batch["last_hidden"][i, :n]
        table.append(
            {
                "sample_id": f"held-{i}",
                "input_ids": batch["input_ids"][i, :n].tolist(),
                "loss_mask": batch["loss_mask"][i, :n].long().tolist(),
                "seq_len": n,
                "aux_hidden": aux_codec.encode(batch["aux_hidden"][i, :n]),
                "last_hidden": last_codec.encode(*target_topk(last, lm_head, topk))
                if isinstance(last_codec, TopKCodec)
                else last_codec.encode(last),
            }
        )
    meta = footer_metadata(
        target_model=str(draft_world.model_dir),
        target_revision=None,
        hidden_size=config.target.hidden_size,
        num_layers=config.target.num_layers,
        layer_ids=config.sglang_layer_ids,
        dtype="float32",
        encoding=encoding,
        chat_template_hash="-",
        system_prompt_policy="keep",
        truncation="quarantine",
        max_seq_len=1024,
        features_fingerprint=out_dir.name,
        topk=encoding_topk(encoding, topk),
    )
    with ShardWriter(out_dir, FEATURE_SCHEMA, metadata=meta) as writer:
        writer.write_table(feature_table(table))
        writer.close()
    return out_dir


def _overwrite_tensor_bytes(export_dir, key: str, garbage: bytes) -> None:
    """Overwrite the middle of one tensor's bytes in ``model.safetensors`` (header intact: it still
    loads)."""
    path = export_dir / "model.safetensors"
    data = bytearray(path.read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    start, end = json.loads(data[8 : 8 + header_len])[key]["data_offsets"]
    at = 8 + header_len + (start + end) // 2 - len(garbage) // 2
    data[at : at + len(garbage)] = garbage
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_preflight_offline_smoke_passes_the_trained_draft_and_tells_a_damaged_one_from_a_weak_one(
    draft_world, trained, tmp_path
):
    import shutil

    from eagle3.gate.preflight import run_offline

    _, _, exports = trained
    features = _held_out_features(draft_world, tmp_path / "features" / "fp")
    (good,) = run_offline(draft_world.config, exports["trained"], features)
    assert good.ok, good.message
    damaged = shutil.copytree(exports["trained"], tmp_path / "damaged")
    # 4 KiB, finite
    garbage = (torch.randn(1024, generator=torch.Generator().manual_seed(0)) * 50).numpy().tobytes()
    _overwrite_tensor_bytes(damaged, "midlayer.mlp.gate_proj.weight", garbage)
    (bad,) = run_offline(draft_world.config, damaged, features)
    assert not bad.ok and "gate.min_accept" in bad.message and "damaged" in bad.message, bad.message
    # a working draft under a floor it cannot reach is weak, not damaged
    high = draft_world.config.replace(gate=draft_world.config.gate.replace(min_accept=100.0))
    (weak,) = run_offline(high, exports["trained"], features)
    assert not weak.ok and "train it on more data" in weak.message, weak.message
    assert "damaged" not in weak.message


@pytest.mark.slow
def test_offline_accept_on_topk_features_of_the_whole_vocab_equals_it_on_the_final_state(
    draft_world, trained, tmp_path
):
    """The preflight's offline check reads fp8_topk features through the same target path: with k =
    the vocab it measures what it measures on the same rows with the final state stored (fp8_aux:
    the same aux bytes)."""
    from eagle3.train.evaluate import accept_on_features

    _, _, exports = trained
    vocab = draft_world.config.target.vocab_size
    accept, shards = [], []
    for encoding in ("fp8_aux", "fp8_topk"):
        features = _held_out_features(
            draft_world, tmp_path / encoding / "fp", encoding=encoding, topk=vocab
        )
        shards.append(next(features.glob("shard-*.parquet")))
        accept.append(
            accept_on_features(draft_world.config, exports["trained"], shards[-1], rows=4)
        )
    untrained = accept_on_features(draft_world.config, exports["untrained"], shards[0], rows=4)
    # the rows show what training taught: equal is not vacuous
    assert accept[0] > untrained, (accept, untrained)
    assert accept[1] == pytest.approx(accept[0], abs=0.01), accept


@pytest.mark.gpu
def test_training_on_a_gpu_places_the_target_head_there_once_not_every_step(draft_world, tmp_path):
    """The frozen embedding and lm_head (2 x 2.35 GB for Kimi-K2.5) go to the GPU when the run
    starts; before, every step copied them host-to-device again. Counted as copies of a head-shaped
    CPU tensor to CUDA."""
    config = with_overrides(draft_world.config, ["train.max_steps=6", "train.precision=bf16"])
    inputs = load_inputs(config, draft_world.vocab_path)
    cuda = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cuda"))
    with _HostToDevice() as copies:
        summary = train_on_source(
            config, ListBatchSource(draft_world.batches), inputs, tmp_path / "draft", cuda
        )
    assert summary["steps"] == 6
    assert copies.shapes.count(tuple(inputs.head.lm_head.shape)) == (1 if inputs.head.tied else 2)


class _HostToDevice(TorchDispatchMode):
    """Records the shape of every CPU tensor copied to a CUDA device while active."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            src = args[1] if func is torch.ops.aten.copy_.default else args[0]
            dst = args[0] if func is torch.ops.aten.copy_.default else out
            if src.device.type == "cpu" and dst.device.type == "cuda":
                self.shapes.append(tuple(src.shape))
        return out
