"""The export stage: a training checkpoint -> the SGLang ``LlamaForCausalLMEagle3`` directory (the
MLA draft's ``Eagle3DeepseekV2ForCausalLM``, ``eagle3.model.export_mla``), plus a model card
(with the Hub's metadata; ``eagle3 push`` publishes the gated champion, ``eagle3.gate.publish``).

The format itself (file names, exact key set and shapes, the vocab maps, validation) is
``eagle3.model.export_format``; this module only fills it. The export is written into ``<dir>.tmp``,
validated there, and renamed, so a broken export is never left where SGLang or the gate could pick
it up. ``eagle_config.eagle_aux_hidden_state_layer_ids`` is in the ``output_of_layer`` convention,
taken from the capture manifest and checked against the config, whose validation has already refused
any set SGLang would map back to other layers on this target family
(``eagle3.config.aux_layers.served_layer_ids``), so training and serving read the same layers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from eagle3.config.aux_layers import to_export_ids
from eagle3.config.base import ConfigError
from eagle3.config.pipeline import PipelineConfig
from eagle3.errors import DataError
from eagle3.model.draft import DraftConfig
from eagle3.model.export_format import (
    CARD_FILE,
    CONFIG_FILE,
    WEIGHTS_FILE,
    attention_summary,
    export_config,
    front_matter,
    full_vocab,
    served_flags,
    validate_export,
)
from eagle3.model.export_mla import is_mla, rename_layer
from eagle3.rundir.layout import CKPT_DIR, METRICS_FILE
from eagle3.rundir.runroot import Manifest
from eagle3.train.checkpoint import LATEST, latest_checkpoint
from eagle3.train.metrics import read_metrics

logger = logging.getLogger(__name__)

# a checkpoint step's draft weights (eagle3.train.checkpoint, export key names)
CKPT_WEIGHTS = "model.safetensors"


def resolve_checkpoint(path: Path) -> Path:
    """A step directory from itself, from ``<out>/ckpt`` or from the training output directory
    (``latest``)."""
    path = Path(path)
    if (path / "trainer.json").exists():
        return path
    for root in (path / CKPT_DIR, path):
        if (root / LATEST).exists():
            found = latest_checkpoint(root)
            if found is not None:
                return found
    raise FileNotFoundError(
        f"no checkpoint under {path}: train first (`eagle3 train`) or pass a step-NNNNNN dir"
    )


def export_layer_ids(config: PipelineConfig, features_manifest: Path | None) -> list[int]:
    """Aux layer ids in the ``output_of_layer`` convention, from the capture manifest (checked
    against config)."""
    expected = config.export_layer_ids
    if features_manifest is None:
        return expected
    path = Path(features_manifest)
    manifest = Manifest.read(path if path.is_dir() else path.parent)
    if manifest is None:
        raise FileNotFoundError(
            f"no manifest.json at {path}: pass the finished features stage directory"
        )
    ids = to_export_ids(manifest.config["layer_ids"], manifest.config["layer_convention"])
    if ids != expected:
        raise ConfigError(
            f"capture used layers {ids} (output_of_layer) but the config says {expected}: "
            "export with the config the features were captured with"
        )
    return ids


def _model_card(config: PipelineConfig, cfg: dict[str, Any], summary: dict[str, Any]) -> str:
    train = config.train
    lines = [
        front_matter(config).rstrip("\n"),
        "",
        f"# EAGLE-3 draft for `{config.target.model_path}`",
        "",
        "Served by SGLang with `--speculative-algorithm EAGLE3 --speculative-draft-model-path <this dir>`.",
        "",
        "## Target",
        f"- model: `{config.target.model_path}` (revision `{config.target.revision or 'main'}`)",
        f"- aux layers (output_of_layer): {cfg['eagle_config']['eagle_aux_hidden_state_layer_ids']}",
        f"- hidden size {cfg['hidden_size']}, vocab {cfg['vocab_size']}, draft vocab {cfg['draft_vocab_size']}",
        "",
        "## Data",
        *[
            f"- {s.label}: weight {s.weight}" + (f", max {s.max_rows} rows" if s.max_rows else "")
            for s in config.sources
        ],
        f"- prompts in total: {config.mix.total or 'all'}; training samples: {summary.get('samples', 'n/a')}, "
        f"tokens: {summary.get('feature_tokens', 'n/a')}",
        "",
        "## Training",
        f"- TTT steps {train.ttt_steps}, step weight decay {train.step_weight_decay}, lr {train.lr}, "
        f"warmup {train.warmup_ratio}, grad clip {train.grad_clip}, epochs {train.epochs}, batch {train.batch_size}, "
        f"precision {train.precision}, parallel {train.parallel} x {train.nproc}",
        f"- objective `{train.loss}`; draft variant {_variant(cfg)}",
        f"- attention: {attention_summary(cfg)}",
        f"- steps trained: {summary.get('step')}",
        "",
        "## Metrics (last logged step)",
        f"- loss: {summary.get('loss')}",
        f"- per-step accuracy: {summary.get('acc')}",
        f"- simulated accept length: {summary.get('accept_length_sim')}",
        "",
    ]
    return "\n".join(lines)


def _variant(cfg: dict[str, Any]) -> str:
    """EAGLE-3, or EAGLE 3.1 with the switches on, as the export's ``config.json`` tells SGLang."""
    on = [flag for flag, value in served_flags(cfg).items() if value]
    return f"EAGLE 3.1 ({', '.join(on)})" if on else "EAGLE-3"


def _training_summary(step_path: Path, step: int, features_manifest: Path | None) -> dict[str, Any]:
    """Last logged metrics of the run and the training-set size (from the features manifest when
    given)."""
    records = read_metrics(step_path.parent.parent / METRICS_FILE)
    summary = {"step": step, **(records[-1] if records else {})}
    path = Path(features_manifest) if features_manifest else None
    manifest = Manifest.read(path) if path is not None and path.is_dir() else None
    if manifest is not None:
        summary |= {"samples": manifest.rows, "feature_tokens": manifest.stats.get("tokens", "n/a")}
    return summary


def _write_validated(
    export_dir: Path, tensors: dict[str, torch.Tensor], cfg: dict[str, Any], card: str
) -> Path:
    """Write into ``<dir>.tmp``, validate, then rename over ``export_dir``; a broken export is never
    left behind."""
    tmp = export_dir.with_name(export_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / WEIGHTS_FILE))
    (tmp / CONFIG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
    (tmp / CARD_FILE).write_text(card)
    problems = validate_export(tmp)
    if problems:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(
            f"refusing to write a broken export to {export_dir}:\n  " + "\n  ".join(problems)
        )
    shutil.rmtree(export_dir, ignore_errors=True)
    os.replace(tmp, export_dir)
    return export_dir


def export_draft(
    config: PipelineConfig,
    ckpt_dir_or_out_dir: Path,
    vocab_path: Path,
    features_manifest: Path | None,
    export_dir: Path,
) -> Path:
    """Write the SGLang directory (config.json, model.safetensors, README.md) after validating it in
    a tmp dir."""
    step_path = resolve_checkpoint(Path(ckpt_dir_or_out_dir))
    trainer_state = json.loads((step_path / "trainer.json").read_text())
    draft = DraftConfig(**trainer_state["draft_config"])
    served = (
        config.export.max_position_embeddings,
        config.server.context_length,
        config.target.context_length,
    )
    draft.max_position_embeddings = max(draft.max_position_embeddings, *(n or 0 for n in served))
    weights = load_file(str(step_path / CKPT_WEIGHTS))
    bad = [k for k, v in weights.items() if v.is_floating_point() and not v.isfinite().all()]
    if bad:
        raise DataError(
            f"{step_path / CKPT_WEIGHTS}: NaN/inf in {len(bad)} tensor(s) ({', '.join(bad[:5])}); not "
            "exported. Train again from an earlier checkpoint (delete the bad step-* directories and "
            "ckpt/latest) after finding the bad data (the trainer names it)"
        )
    vocab = load_file(str(vocab_path))
    dtype = "float32" if config.train.precision == "fp32" else "bfloat16"
    tensors = {
        k: v.to(torch.float32 if dtype == "float32" else torch.bfloat16) for k, v in weights.items()
    }
    cfg = export_config(draft, export_layer_ids(config, features_manifest), dtype=dtype)
    if is_mla(cfg):
        tensors = rename_layer(tensors, to_export=True)
    if not full_vocab(cfg):
        tensors |= {"d2t": vocab["d2t"].long(), "t2d": vocab["t2d"].bool()}
    card = _model_card(
        config, cfg, _training_summary(step_path, trainer_state["step"], features_manifest)
    )
    export_dir = _write_validated(Path(export_dir), tensors, cfg, card)
    logger.info("exported draft %s (%s) to %s", step_path.name, cfg["architectures"][0], export_dir)
    return export_dir
