"""An EAGLE 3.1 draft trained with an LK loss on the tiny world, end to end through our code: the configured
architecture reaches the draft, the loss falls, the export carries the flags and norm weights, and the reference
speculative decoder (the server's and ``eagle3 eval``'s) decodes exactly the target's greedy output with it."""

from __future__ import annotations

import json

import pytest
import torch

from eagle3.config import with_overrides
from eagle3.dev.distil import greedy_answers
from eagle3.model.export_format import served_flags, validate_export
from eagle3.serve.specdec import SpeculativeDecoder
from eagle3.train.distributed import DistInfo
from eagle3.train.export import export_draft
from eagle3.train.trainer import ListBatchSource, load_inputs, train_on_source

CPU = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


@pytest.mark.slow
def test_eagle31_lk_lambda_draft_trains_exports_and_decodes_exactly_greedy(draft_world, tmp_path):
    config = with_overrides(draft_world.config, ["train.architecture.fc_norm=true",
                                                 "train.architecture.norm_output=true", "train.loss=lk_lambda",
                                                 "train.epochs=2"])
    inputs = load_inputs(config, draft_world.vocab_path)
    assert (inputs.draft_config.fc_norm, inputs.draft_config.norm_output) == (True, True)
    summary = train_on_source(config, ListBatchSource(draft_world.batches), inputs, tmp_path / "draft", CPU)
    assert summary["final_loss"] < summary["first_loss"]
    export = export_draft(config, tmp_path / "draft", draft_world.vocab_path, None, tmp_path / "export")
    cfg = json.loads((export / "config.json").read_text())
    assert served_flags(cfg) == {"fc_norm": True, "norm_output": True, "norm_before_fc": False}
    assert validate_export(export) == []
    prompts = draft_world.held_out[:6]
    reference = greedy_answers(draft_world.target, prompts, max_new_tokens=24, eos_id=draft_world.eos,
                               pad_id=draft_world.tokenizer.pad_token_id, batch_size=1)
    decoder = SpeculativeDecoder(draft_world.target, draft_world.tokenizer, export, num_steps=3)
    assert decoder.draft.config.norm_output and hasattr(decoder.draft, "fc_norm")
    for prompt, expected in zip(prompts, reference, strict=True):
        assert decoder.generate(prompt, 24, [draft_world.eos]).tokens == expected
