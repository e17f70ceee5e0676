"""An MLA draft with the full vocab on the tiny world, train to serve:
``train.architecture.attention=mla`` reaches the draft, the loss falls, the export is SGLang's
``Eagle3DeepseekV2ForCausalLM`` without vocab maps and passes static preflight, the reference
decoder decodes exactly the target's greedy output with it, and the reference server's batched
engine (per-head K/V caches of unequal widths, joined and compacted across rows) does too, with
fewer target passes than tokens."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3.config.pipeline import with_overrides
from eagle3.gate.preflight import failed, run_static
from eagle3.serve.launch_commands import build_launch
from eagle3.serve.reference.protocol import SamplingParams, Sequence
from eagle3.serve.reference.spec_decoder import SpeculativeDecoder
from eagle3.serve.reference.spec_engine import build_speculative_engine
from eagle3.train.distributed import DistInfo
from eagle3.train.export import export_draft
from eagle3.train.identity import load_inputs
from eagle3.train.trainer import train_on_source
from eagle3.worlds.distil import ListBatchSource, greedy_answers, write_draft_vocab

pytestmark = pytest.mark.slow
CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
MAX_NEW = 24


@pytest.fixture(scope="module")
def trained_mla(draft_world, tmp_path_factory) -> tuple[dict, Path, object]:
    out = tmp_path_factory.mktemp("mla")
    vocab_size = draft_world.target.config.vocab_size
    vocab = write_draft_vocab(
        draft_world.sequences,
        vocab_size=vocab_size,
        draft_vocab_size=vocab_size,
        path=out / "vocab.safetensors",
    )
    config = with_overrides(
        draft_world.config,
        [
            "train.architecture.attention=mla",
            "train.epochs=2",
            f"vocab.draft_vocab_size={vocab_size}",
        ],
    )
    inputs = load_inputs(config, vocab)
    assert (
        inputs.draft_config.attention == "mla"
        and inputs.draft_config.draft_vocab_size == vocab_size
    )
    summary = train_on_source(
        config, ListBatchSource(draft_world.batches), inputs, out / "draft", CPU
    )
    return summary, export_draft(config, out / "draft", vocab, None, out / "export"), config


def test_mla_draft_trains_exports_passes_preflight_and_decodes_exactly_greedy(
    draft_world, trained_mla
):
    summary, export, config = trained_mla
    assert summary["final_loss"] < summary["first_loss"]
    cfg = json.loads((export / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert cfg["draft_vocab_size"] == cfg["vocab_size"]
    spec = build_launch(config, "eagle3", engine="sglang", draft=export, port=30000)
    base = build_launch(config, "baseline", engine="sglang", port=30000)
    checks = run_static(config, export, baseline=base, spec=spec)
    assert [c.line() for c in failed(checks)] == []
    assert {"mla_head", "mla_config", "mla_vllm_layer_ids"} <= {c.name for c in checks}
    prompts = draft_world.held_out[:6]
    reference = greedy_answers(
        draft_world.target,
        prompts,
        max_new_tokens=MAX_NEW,
        eos_id=draft_world.eos,
        pad_id=draft_world.tokenizer.pad_token_id,
        batch_size=1,
    )
    decoder = SpeculativeDecoder(draft_world.target, draft_world.tokenizer, export, num_steps=3)
    decoded = [decoder.generate(p, MAX_NEW, [draft_world.eos]) for p in prompts]
    assert [d.tokens for d in decoded] == reference
    accept = sum(len(d.tokens) for d in decoded) / sum(d.passes for d in decoded)
    assert accept > 1.3  # the MLA draft predicts: an untrained one accepts ~nothing


def test_the_batched_engine_serves_the_mla_draft_exactly_greedy(draft_world, trained_mla):
    _, export, _ = trained_mla
    args = argparse.Namespace(
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=str(export),
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        max_running_requests=3,
    )
    engine = build_speculative_engine(
        draft_world.target, draft_world.tokenizer, args, context_length=1024
    )
    prompts = draft_world.held_out[6:12]
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=0.0)
    waiting, finished = [Sequence(f"r{i}", p, params) for i, p in enumerate(prompts)], []
    while waiting or engine.num_running():  # requests join between cycles while others run
        room = engine.max_running - engine.num_running()
        engine.admit(waiting[:room])
        waiting = waiting[room:]
        finished += engine.step()[1]
    done = sorted(finished, key=lambda s: int(s.rid[1:]))
    eos = sorted(engine.finish.eos_ids)
    for seq, prompt in zip(done, prompts, strict=True):
        ref = draft_world.target.generate(
            torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos
        )
        assert seq.output_ids == ref[0, len(prompt) :].tolist()
    assert sum(s.verify_ct for s in done) < sum(len(s.output_ids) for s in done)


def test_an_mla_full_vocab_champion_starts_the_next_night(trained_mla, tmp_path):
    """A continual night from an MLA champion: its export's ``layers.0.`` tensors are tonight's
    draft's, they load into it as its start, and its vocab (no maps) is the identity."""
    from eagle3.model.export_format import load_draft
    from eagle3.train.continual import (
        Start,
        champion_weights,
        check_champion,
        write_champion_vocab,
    )
    from eagle3.train.identity import load_inputs
    from eagle3.train.trainer import build_draft

    _, export, config = trained_mla
    cfg = check_champion(config, export, "mla-champion")
    start = Start(mode="champion", champion_id="mla-champion", champion_dir=str(export))
    vocab = load_file(str(write_champion_vocab(start, tmp_path / "vocab.safetensors")))
    assert cfg["draft_vocab_size"] == vocab["d2t"].numel() and not vocab["d2t"].any()
    inputs = load_inputs(config, tmp_path / "vocab.safetensors")
    draft = build_draft(inputs, 0, champion_weights(start))
    exported, *_ = load_draft(export)
    for name, tensor in exported.state_dict().items():
        assert torch.equal(draft.state_dict()[name], tensor), name
