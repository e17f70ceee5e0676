"""An exported draft's simulated accept length on captured features, without running the target.

The accept length the training metrics report, on rows of one feature shard: the gate's offline
preflight check."""

from __future__ import annotations

from pathlib import Path

import torch

from eagle3.config.pipeline import PipelineConfig
from eagle3.model.export_format import load_draft
from eagle3.target_io import load_hf_config
from eagle3.train.data import FeatureDataset
from eagle3.train.identity import DraftInputs, target_head
from eagle3.train.loss import TTTObjective, accept_length, prepare_batch


@torch.no_grad()
def accept_on_features(
    config: PipelineConfig, export_dir: Path, shard: Path, *, rows: int
) -> float:
    """Simulated accept length (``accept_length`` of the per-step accuracies, as ``metrics.jsonl``
    reports it) of an exported draft on the first ``rows`` rows of one feature shard, on CPU: the
    target is not run, its captured states are; a draft whose weights were damaged after training
    falls to ~1."""
    draft, d2t, _, _ = load_draft(export_dir)
    head = target_head(config, load_hf_config(config.target))
    inputs = DraftInputs(draft_config=draft.config, head=head, d2t=d2t.long())
    loader = FeatureDataset(
        [shard],
        batch_size=rows,
        shuffle=False,
        max_seq_len=config.train.max_seq_len,
        hidden_dtype=torch.float32,
    )
    steps = config.train.ttt_steps
    ids, aux, probs, masks, _ = prepare_batch(
        next(iter(loader)), inputs, steps, torch.device("cpu")
    )
    objective = TTTObjective(draft.float(), steps=steps, decay=config.train.step_weight_decay)
    denominators = masks.sum(dim=(1, 2)).clamp(min=1.0)
    _, stats = objective(ids, aux, inputs.head.embed.float(), probs, masks, denominators)
    return accept_length((stats[:, 1] / stats[:, 2].clamp(min=1.0)).tolist())
