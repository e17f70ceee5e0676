"""Export a trained draft as the SGLang ``LlamaForCausalLMEagle3`` directory, validate it, and load it back.

SGLang silently drops unknown keys and silently skips ``fc`` when the hidden widths match, so a wrong export does
not fail at load: it serves with accept length ~1. Export therefore writes *exactly* the key set of DESIGN §4 (no
``embed_tokens``: SGLang takes the target's), checks every shape against ``config.json``, and refuses to write an
export that ``validate_export`` finds a problem with. The export is written into ``<dir>.tmp`` and renamed.
``eagle_config.eagle_aux_hidden_state_layer_ids`` is in the ``output_of_layer`` convention (SGLang adds 1), taken
from the capture manifest so training and serving read the same layers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagle3.config import ConfigError, PipelineConfig, to_export_ids
from eagle3.model.draft import DraftConfig, DraftModel
from eagle3.runroot import Manifest

logger = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
ARCHITECTURE = "LlamaForCausalLMEagle3"
EXPORT_KEYS: tuple[str, ...] = (
    "d2t",
    "fc.weight",
    "lm_head.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "norm.weight",
    "t2d",
)


def expected_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Shape of every exported tensor implied by an export ``config.json``."""
    h, th = cfg["hidden_size"], cfg.get("target_hidden_size", cfg["hidden_size"])
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv, inter = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d, cfg["intermediate_size"]
    return {
        "d2t": (cfg["draft_vocab_size"],),
        "t2d": (cfg["vocab_size"],),
        "fc.weight": (h, 3 * th),
        "lm_head.weight": (cfg["draft_vocab_size"], h),
        "norm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.mlp.gate_proj.weight": (inter, h),
        "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
    }


def export_config(draft: DraftConfig, layer_ids: list[int], *, dtype: str = "bfloat16") -> dict[str, Any]:
    """The ``config.json`` of an export: LlamaConfig fields of the draft plus the EAGLE-3 fields."""
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": draft.hidden_size,
        "intermediate_size": draft.intermediate_size,
        "num_attention_heads": draft.num_attention_heads,
        "num_key_value_heads": draft.num_key_value_heads,
        "head_dim": draft.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": draft.hidden_act,
        "rms_norm_eps": draft.rms_norm_eps,
        "rope_theta": draft.rope_theta,
        "rope_scaling": draft.rope_scaling,
        "max_position_embeddings": draft.max_position_embeddings,
        "vocab_size": draft.vocab_size,
        "draft_vocab_size": draft.draft_vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": dtype,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True},
    }
    if draft.target_hidden_size != draft.hidden_size:
        cfg["target_hidden_size"] = draft.target_hidden_size
    return cfg


def draft_config_from_export(cfg: dict[str, Any]) -> DraftConfig:
    return DraftConfig(
        hidden_size=cfg["hidden_size"], target_hidden_size=cfg.get("target_hidden_size", cfg["hidden_size"]),
        num_attention_heads=cfg["num_attention_heads"], num_key_value_heads=cfg["num_key_value_heads"],
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
        intermediate_size=cfg["intermediate_size"], rms_norm_eps=cfg["rms_norm_eps"], rope_theta=cfg["rope_theta"],
        rope_scaling=cfg.get("rope_scaling"), max_position_embeddings=cfg["max_position_embeddings"],
        vocab_size=cfg["vocab_size"], draft_vocab_size=cfg["draft_vocab_size"],
        hidden_act=cfg.get("hidden_act", "silu"),
    )


def _config_problems(cfg: dict[str, Any]) -> list[str]:
    problems = []
    if cfg.get("architectures") != [ARCHITECTURE]:
        problems.append(f"architectures is {cfg.get('architectures')}, SGLang needs [{ARCHITECTURE!r}]")
    if cfg.get("num_hidden_layers") != 1:
        problems.append(f"num_hidden_layers is {cfg.get('num_hidden_layers')}, an EAGLE-3 draft has 1")
    if cfg.get("tie_word_embeddings") is not False:
        problems.append("tie_word_embeddings must be false (SGLang would replace lm_head by the embedding)")
    eagle = cfg.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if not (isinstance(ids, list) and len(ids) == 3 and all(isinstance(i, int) for i in ids)):
        problems.append(f"eagle_config.eagle_aux_hidden_state_layer_ids is {ids!r}: write 3 ids (output_of_layer)")
    if eagle.get("use_aux_hidden_state") is not True:
        problems.append("eagle_config.use_aux_hidden_state must be true")
    missing = [k for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                           "vocab_size", "draft_vocab_size", "max_position_embeddings") if k not in cfg]
    problems += [f"config.json lacks {k}" for k in missing]
    return problems


def _vocab_problems(d2t: torch.Tensor, t2d: torch.Tensor) -> list[str]:
    targets = torch.arange(len(d2t)) + d2t.long()
    problems = []
    if len(targets) and (targets.min() < 0 or targets.max() >= len(t2d)):
        problems.append("d2t maps draft ids outside the target vocab")
        return problems
    if len(targets) > 1 and not bool((targets[1:] > targets[:-1]).all()):
        problems.append("d2t target ids are not strictly increasing")
    if t2d.dtype != torch.bool or int(t2d.sum()) != len(d2t) or not bool(t2d[targets].all()):
        problems.append("t2d is not the bool mask of exactly the d2t target ids")
    return problems


def validate_export(export_dir: Path) -> list[str]:
    """Every problem that would make SGLang serve this draft wrongly; an empty list means it is sound."""
    export_dir = Path(export_dir)
    if not (export_dir / CONFIG).exists() or not (export_dir / WEIGHTS).exists():
        return [f"{export_dir} lacks {CONFIG} or {WEIGHTS}: re-run `eagle3 export`"]
    cfg = json.loads((export_dir / CONFIG).read_text())
    problems = _config_problems(cfg)
    if problems:
        return problems
    with safe_open(str(export_dir / WEIGHTS), framework="pt") as fh:
        shapes = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118
    keys = set(shapes)
    problems += [f"missing tensor {k}" for k in sorted(set(EXPORT_KEYS) - keys)]
    problems += [f"unexpected tensor {k} (SGLang would silently drop it)" for k in sorted(keys - set(EXPORT_KEYS))]
    for key, shape in expected_shapes(cfg).items():
        if key in shapes and shapes[key] != shape:
            problems.append(f"{key} has shape {list(shapes[key])}, config.json implies {list(shape)}")
    if not problems:
        tensors = load_file(str(export_dir / WEIGHTS))
        problems += _vocab_problems(tensors["d2t"], tensors["t2d"])
    return problems


def resolve_checkpoint(path: Path) -> Path:
    """A step directory from itself, from ``<out>/ckpt`` or from the training output directory (``latest``)."""
    from eagle3.train.checkpoint import latest_checkpoint

    path = Path(path)
    if (path / "trainer.json").exists():
        return path
    for root in (path / "ckpt", path):
        if (root / "latest").exists():
            found = latest_checkpoint(root)
            if found is not None:
                return found
    raise FileNotFoundError(f"no checkpoint under {path}: train first (`eagle3 train`) or pass a step-NNNNNN dir")


def export_layer_ids(config: PipelineConfig, features_manifest: Path | None) -> list[int]:
    """Aux layer ids in the ``output_of_layer`` convention, from the capture manifest (checked against config)."""
    expected = config.export_layer_ids
    if features_manifest is None:
        return expected
    path = Path(features_manifest)
    manifest = Manifest.read(path if path.is_dir() else path.parent)
    if manifest is None:
        raise FileNotFoundError(f"no manifest.json at {path}: pass the finished features stage directory")
    ids = to_export_ids(manifest.config["layer_ids"], manifest.config["layer_convention"])
    if ids != expected:
        raise ConfigError(f"capture used layers {ids} (output_of_layer) but the config says {expected}: "
                          "export with the config the features were captured with")
    return ids


def _model_card(config: PipelineConfig, cfg: dict[str, Any], summary: dict[str, Any]) -> str:
    train = config.train
    lines = [
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
        *[f"- {s.label}: weight {s.weight}" + (f", max {s.max_rows} rows" if s.max_rows else "")
          for s in config.sources],
        f"- prompts in total: {config.mix.total or 'all'}; training samples: {summary.get('samples', 'n/a')}, "
        f"tokens: {summary.get('feature_tokens', 'n/a')}",
        "",
        "## Training",
        f"- TTT steps {train.ttt_steps}, step weight decay {train.step_weight_decay}, lr {train.lr}, "
        f"warmup {train.warmup_ratio}, grad clip {train.grad_clip}, epochs {train.epochs}, batch {train.batch_size}, "
        f"precision {train.precision}, parallel {train.parallel} x {train.nproc}",
        f"- steps trained: {summary.get('step')}",
        "",
        "## Metrics (last logged step)",
        f"- loss: {summary.get('loss')}",
        f"- per-step accuracy: {summary.get('acc')}",
        f"- simulated accept length: {summary.get('accept_length_sim')}",
        "",
    ]
    return "\n".join(lines)


def _training_summary(step_path: Path, step: int, features_manifest: Path | None) -> dict[str, Any]:
    """Last logged metrics of the run and the training-set size (from the features manifest when given)."""
    from eagle3.train.metrics import METRICS_FILE, read_metrics

    records = read_metrics(step_path.parent.parent / METRICS_FILE)
    summary = {"step": step, **(records[-1] if records else {})}
    path = Path(features_manifest) if features_manifest else None
    manifest = Manifest.read(path) if path is not None and path.is_dir() else None
    if manifest is not None:
        summary |= {"samples": manifest.rows, "feature_tokens": manifest.stats.get("tokens", "n/a")}
    return summary


def _write_validated(export_dir: Path, tensors: dict[str, torch.Tensor], cfg: dict[str, Any], card: str) -> Path:
    """Write into ``<dir>.tmp``, validate, then rename over ``export_dir``; a broken export is never left behind."""
    tmp = export_dir.with_name(export_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / WEIGHTS))
    (tmp / CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")
    (tmp / "README.md").write_text(card)
    problems = validate_export(tmp)
    if problems:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(f"refusing to write a broken export to {export_dir}:\n  " + "\n  ".join(problems))
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
    """Write the SGLang directory (config.json, model.safetensors, README.md) after validating it in a tmp dir."""
    step_path = resolve_checkpoint(Path(ckpt_dir_or_out_dir))
    trainer_state = json.loads((step_path / "trainer.json").read_text())
    draft = DraftConfig(**trainer_state["draft_config"])
    served = (config.export.max_position_embeddings, config.server.context_length, config.target.context_length)
    draft.max_position_embeddings = max(draft.max_position_embeddings, *(n or 0 for n in served))
    weights = load_file(str(step_path / WEIGHTS))
    vocab = load_file(str(vocab_path))
    dtype = "float32" if config.train.precision == "fp32" else "bfloat16"
    tensors = {k: v.to(torch.float32 if dtype == "float32" else torch.bfloat16) for k, v in weights.items()}
    tensors |= {"d2t": vocab["d2t"].long(), "t2d": vocab["t2d"].bool()}
    cfg = export_config(draft, export_layer_ids(config, features_manifest), dtype=dtype)
    card = _model_card(config, cfg, _training_summary(step_path, trainer_state["step"], features_manifest))
    export_dir = _write_validated(Path(export_dir), tensors, cfg, card)
    logger.info("exported draft %s (%s) to %s", step_path.name, ARCHITECTURE, export_dir)
    if config.export.push_to_hub:
        push_to_hub(export_dir, config.export.push_to_hub)
    return export_dir


def push_to_hub(export_dir: Path, repo_id: str) -> str:
    """Upload an export with ``huggingface_hub`` (token from ``HF_TOKEN`` in the environment only)."""
    from huggingface_hub import HfApi

    token = os.environ.get("HF_TOKEN")
    if not token:
        raise ConfigError("set HF_TOKEN in the environment to push to the Hub (it is never read from config)")
    api = HfApi(token=token)
    api.create_repo(repo_id, exist_ok=True)
    info = api.upload_folder(folder_path=str(export_dir), repo_id=repo_id)
    logger.info("pushed %s to %s", export_dir, repo_id)
    return str(info)


def load_draft(export_dir: Path) -> tuple[DraftModel, torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Load an export for evaluation: ``(DraftModel in eval mode, d2t, t2d, config.json)``; validates first."""
    export_dir = Path(export_dir)
    problems = validate_export(export_dir)
    if problems:
        raise ValueError(f"{export_dir} is not a valid EAGLE-3 export:\n  " + "\n  ".join(problems))
    cfg = json.loads((export_dir / CONFIG).read_text())
    tensors = load_file(str(export_dir / WEIGHTS))
    d2t, t2d = tensors.pop("d2t"), tensors.pop("t2d")
    model = DraftModel(draft_config_from_export(cfg))
    model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return model.eval(), d2t, t2d, cfg
