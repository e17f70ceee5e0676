"""The SGLang EAGLE-3 export format (``LlamaForCausalLMEagle3``, or ``Eagle3DeepseekV2ForCausalLM``
for the MLA draft, ``eagle3.model.export_mla``): the one definition that writing, checking and
loading an export directory all use.

Why it is this strict: SGLang silently drops unknown keys and silently skips ``fc`` when the hidden
widths match, so a wrong export does not fail at load, it serves with accept length ~1. Hence:

* An export directory holds ``config.json`` and ``model.safetensors`` (the draft itself,
  ``EXPORT_FILES``) plus a ``README.md`` model card.
* ``model.safetensors`` holds *exactly* the keys of ``expected_shapes`` (docs/DESIGN.md, "The
  export"), each with the shape the ``config.json`` implies. There is no ``embed_tokens``: SGLang
  takes the target's.
* The vocab maps (docs/DESIGN.md, "The draft vocab"): draft id ``i`` emits target id ``i + d2t[i]``
  (``d2t`` holds int64 offsets, SGLang's format); the target ids are strictly increasing and inside
  the target vocab; ``t2d`` is the bool mask over the target vocab of exactly those ids.
  ``vocab_maps`` builds the pair, ``vocab_problems`` checks it.
* ``eagle_config.eagle_aux_hidden_state_layer_ids`` are 3 ids in the ``output_of_layer`` convention
  (SGLang adds 1).
* EAGLE 3.1 (``served_flags``): ``fc_norm: true`` adds ``fc_norm.{0,1,2}.weight`` ``[H_t]``,
  ``eagle_config. norm_before_fc: true`` adds ``input_norm.weight`` ``[3H_t]``, ``norm_output:
  true`` adds no weight. They are written only when on, so an EAGLE-3 export is unchanged. SGLang
  0.5.23 drops a norm weight whose flag is absent without a word (a 3.1 draft then serves as a
  damaged 3.0 one), hence the key set follows the flags exactly.
* A full-vocab draft (``vocab.draft_vocab_size`` = the target's vocab: ``draft_vocab_size ==
  vocab_size``) has no ``d2t``/``t2d``: its ids are the target's, as in the published Kimi MLA
  drafts, and SGLang then sees no reduced vocab (its rejection sampling refuses one).

``load_export`` reads what checks need (config, tensor shapes from the safetensors header, the vocab
maps) without judging it; ``validate_export`` lists every problem, each naming the file and the fix;
``load_draft`` gives a ``DraftModel`` for evaluation and refuses an export with any problem.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from eagle3.config.pipeline import PipelineConfig
from eagle3.model.draft import DraftConfig, DraftModel
from eagle3.model.export_mla import (
    EXPORT_LAYER,
    MLA_ARCHITECTURE,
    MLA_SIZES,
    MODEL_LAYER,
    is_mla,
    mla_attention_shapes,
    mla_config_fields,
    mla_draft_fields,
    rename_layer,
)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "README.md"
# what the draft is (its content id hashes these)
EXPORT_FILES: tuple[str, ...] = (CONFIG_FILE, WEIGHTS_FILE)
ARCHITECTURE = "LlamaForCausalLMEagle3"
CARD_TAGS: tuple[str, ...] = ("eagle3", "speculative-decoding", "sglang")
CARD_LIBRARY = "sglang"  # the draft is served by SGLang, not loadable by transformers alone
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
REEXPORT = "re-export the draft with `eagle3 export`"


def served_flags(cfg: dict[str, Any]) -> dict[str, bool]:
    """The EAGLE 3.1 switches of an export ``config.json`` as SGLang 0.5.23 reads them
    (``llama_eagle3.py``): ``fc_norm`` (or legacy ``use_aux_norm``), ``norm_output``, and
    ``norm_before_fc`` from ``eagle_config`` (or the top level)."""
    eagle = cfg.get("eagle_config") or {}
    return {
        "fc_norm": bool(cfg.get("fc_norm") or cfg.get("use_aux_norm", False)),
        "norm_output": bool(cfg.get("norm_output", False)),
        "norm_before_fc": bool(eagle.get("norm_before_fc", cfg.get("norm_before_fc", False))),
    }


FC_NORM_KEYS = ("fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight")
# SGLang maps them
LEGACY_FC_NORM_KEYS = ("aux_norm_low.weight", "aux_norm_mid.weight", "aux_norm_high.weight")


def norm_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The EAGLE 3.1 norm weights (export key names) the config's flags imply, with their shapes."""
    th, flags = cfg.get("target_hidden_size", cfg["hidden_size"]), served_flags(cfg)
    shapes: dict[str, tuple[int, ...]] = (
        dict.fromkeys(FC_NORM_KEYS, (th,)) if flags["fc_norm"] else {}
    )
    if flags["norm_before_fc"]:
        shapes["input_norm.weight"] = (3 * th,)
    return shapes


def variant_problems(cfg: dict[str, Any], keys: Iterable[str]) -> list[str]:
    """Where the EAGLE 3.1 flags of ``config.json`` and the norm weights present disagree, each with
    its fix. SGLang drops a norm weight whose flag is absent without an error (the draft serves as a
    damaged EAGLE-3 one) and runs a flag without its weight on an untrained, all-ones norm; neither
    fails at load."""
    flags, keys = served_flags(cfg), set(keys)
    problems = []
    for flag, names, fix in (
        ("fc_norm", FC_NORM_KEYS + LEGACY_FC_NORM_KEYS, "train.architecture.fc_norm=true"),
        ("norm_before_fc", ("input_norm.weight",), "train.architecture.norm_before_fc=true"),
    ):
        present = sorted(keys & set(names))
        where = "eagle_config.norm_before_fc" if flag == "norm_before_fc" else flag
        if present and not flags[flag]:
            problems.append(
                f"weights {present} without {where}: true in config.json: SGLang 0.5.23 drops them "
                f"silently and serves another draft than the trained one; set {where}: true (re-export "
                f"the draft trained with {fix})"
            )
        elif flags[flag] and not present:
            problems.append(
                f"config.json sets {where} but the weights lack {list(names[:3])}: SGLang would run "
                f"untrained (all-ones) norms; re-export the draft trained with {fix}, or drop the flag"
            )
    return problems


def full_vocab(cfg: dict[str, Any]) -> bool:
    """Whether the draft's vocab is the target's (no ``d2t``/``t2d`` in the export)."""
    return cfg.get("draft_vocab_size") == cfg.get("vocab_size")


def _mha_attention_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    h = cfg["hidden_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    return {
        "self_attn.q_proj.weight": (q, 2 * h),  # attention reads cat([embed, hidden]): 2H
        "self_attn.k_proj.weight": (kv, 2 * h),
        "self_attn.v_proj.weight": (kv, 2 * h),
        "self_attn.o_proj.weight": (h, q),
    }


def expected_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The exact key set of ``model.safetensors`` and each tensor's shape, implied by an export
    ``config.json``.

    Raises ``KeyError`` naming a size field the config lacks."""
    h, th = cfg["hidden_size"], cfg.get("target_hidden_size", cfg["hidden_size"])
    inter, mla = cfg["intermediate_size"], is_mla(cfg)
    layer = (mla_attention_shapes(cfg) if mla else _mha_attention_shapes(cfg)) | {
        "hidden_norm.weight": (h,),
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (inter, h),
        "mlp.up_proj.weight": (inter, h),
        "mlp.down_proj.weight": (h, inter),
    }
    maps = {"d2t": (cfg["draft_vocab_size"],), "t2d": (cfg["vocab_size"],)}
    maps = {} if full_vocab(cfg) else maps
    return (
        norm_shapes(cfg)
        | maps
        | {
            "fc.weight": (h, 3 * th),  # [H, 3*H_target]: fuses the three aux layers
            "lm_head.weight": (cfg["draft_vocab_size"], h),
            "norm.weight": (h,),
        }
        | {(EXPORT_LAYER if mla else MODEL_LAYER) + k: shape for k, shape in layer.items()}
    )


def attention_summary(cfg: dict[str, Any]) -> str:
    """An export's attention and vocab in one line (its cards): MLA with its sizes, or MHA."""
    vocab = f"draft vocab {cfg['draft_vocab_size']}"
    vocab = "full target vocab (no d2t)" if full_vocab(cfg) else vocab
    if is_mla(cfg):
        sizes = ", ".join(f"{k} {cfg[k]}" for k in MLA_SIZES)
        heads = f"{cfg['num_attention_heads']} heads"
        return f"MLA (`{cfg['architectures'][0]}`, {heads}, {sizes}); {vocab}"
    heads = f"{cfg['num_attention_heads']} heads, {cfg['num_key_value_heads']} kv heads"
    return f"MHA (`{cfg['architectures'][0]}`, {heads}); {vocab}"


def export_config(
    draft: DraftConfig, layer_ids: list[int], *, dtype: str = "bfloat16"
) -> dict[str, Any]:
    """The ``config.json`` of an export: LlamaConfig fields of the draft plus the EAGLE-3 fields
    (the MLA draft: its DeepSeek fields instead, ``export_mla.mla_config_fields``)."""
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
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(layer_ids),
            "use_aux_hidden_state": True,
        },
    }
    if draft.target_hidden_size != draft.hidden_size:
        cfg["target_hidden_size"] = draft.target_hidden_size
    if draft.fc_norm:
        cfg["fc_norm"] = True
    if draft.norm_output:
        cfg["norm_output"] = True
    if draft.norm_before_fc:
        cfg["eagle_config"]["norm_before_fc"] = True
    if draft.attention == "mla":
        del cfg["head_dim"]
        cfg |= mla_config_fields(draft, layer_ids)
    return cfg


def draft_config_from_export(cfg: dict[str, Any]) -> DraftConfig:
    """The draft architecture an export ``config.json`` describes (the inverse of
    ``export_config``)."""
    shape = (
        mla_draft_fields(cfg)
        if is_mla(cfg)
        else {
            "num_key_value_heads": cfg["num_key_value_heads"],
            "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
        }
    )
    return DraftConfig(
        hidden_size=cfg["hidden_size"],
        target_hidden_size=cfg.get("target_hidden_size", cfg["hidden_size"]),
        num_attention_heads=cfg["num_attention_heads"],
        intermediate_size=cfg["intermediate_size"],
        rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"],
        rope_scaling=cfg.get("rope_scaling"),
        max_position_embeddings=cfg["max_position_embeddings"],
        vocab_size=cfg["vocab_size"],
        draft_vocab_size=cfg["draft_vocab_size"],
        hidden_act=cfg.get("hidden_act", "silu"),
        **served_flags(cfg),
        **shape,
    )


# ---------------------------------------------------------------------------------------------------------------
# The vocab maps
# ---------------------------------------------------------------------------------------------------------------


def vocab_maps(target_ids: torch.Tensor, target_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t, t2d)`` of a draft vocab given as ascending target ids: int64 offsets and the bool
    target mask."""
    target_ids = target_ids.to(torch.int64)
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[target_ids] = True
    return target_ids - torch.arange(target_ids.numel(), dtype=torch.int64), t2d


def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """The target id of each draft id: ``draft_id + d2t[draft_id]``."""
    return torch.arange(d2t.numel(), dtype=torch.int64, device=d2t.device) + d2t.long()


def vocab_problems(d2t: torch.Tensor, t2d: torch.Tensor | None, target_vocab: int) -> list[str]:
    """What breaks the vocab-map rules (the caller adds the file and the fix); ``t2d`` None checks
    ``d2t`` only."""
    targets = target_ids(d2t)
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= target_vocab):
        return [
            f"d2t maps to target ids in [{int(targets.min())}, {int(targets.max())}], outside the vocab "
            f"[0, {target_vocab}): d2t must hold offsets target_id - draft_id"
        ]
    problems = []
    if targets.numel() > 1 and not bool((targets[1:] > targets[:-1]).all()):
        problems.append(
            "d2t target ids are not strictly increasing (draft ids are the selected target ids sorted "
            "ascending)"
        )
    if t2d is not None and (
        t2d.dtype != torch.bool
        or t2d.numel() != target_vocab
        or int(t2d.sum()) != targets.numel()
        or not bool(t2d[targets].all())
    ):
        problems.append(
            f"t2d and d2t disagree: t2d must be the bool mask over the {target_vocab} target ids of "
            "exactly the d2t targets"
        )
    return problems


# ---------------------------------------------------------------------------------------------------------------
# Reading and validating an export directory
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftExport:
    """What checks need from an export dir: its config, every tensor's shape, and the vocab maps
    (when present)."""

    path: Path
    config: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    d2t: torch.Tensor | None
    t2d: torch.Tensor | None


def missing_files(export_dir: Path) -> list[Path]:
    """The files of ``EXPORT_FILES`` that ``export_dir`` lacks."""
    return [
        Path(export_dir) / name for name in EXPORT_FILES if not (Path(export_dir) / name).exists()
    ]


def load_export(export_dir: Path) -> DraftExport:
    """Read an export dir without judging it (only ``d2t``/``t2d`` are loaded; other shapes come
    from the header).

    Raises ``FileNotFoundError`` naming the missing file and the fix when it is not an export
    dir."""
    export_dir = Path(export_dir)
    for path in missing_files(export_dir):
        raise FileNotFoundError(
            f"{path} is missing: point at an export dir written by `eagle3 export`"
        )
    config = json.loads((export_dir / CONFIG_FILE).read_text())
    try:
        with safe_open(str(export_dir / WEIGHTS_FILE), framework="pt") as fh:
            keys = list(fh.keys())
            shapes = {k: tuple(fh.get_slice(k).get_shape()) for k in keys}
            d2t = fh.get_tensor("d2t") if "d2t" in keys else None
            t2d = fh.get_tensor("t2d") if "t2d" in keys else None
    except SafetensorError as exc:  # zero bytes, cut short, a damaged header
        weights = export_dir / WEIGHTS_FILE
        raise ValueError(
            f"{weights} is not a readable safetensors file ({exc}): {REEXPORT}"
        ) from None
    return DraftExport(export_dir, config, shapes, d2t, t2d)


def non_finite_tensors(path: Path) -> list[str]:
    """Names of the floating-point tensors of a safetensors file holding NaN or inf (one tensor in
    memory at a time). A NaN-trained draft has the right keys and shapes, so only this finds it."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            names = list(fh.keys())
            return [
                k
                for k in names
                if (t := fh.get_tensor(k)).is_floating_point() and not t.isfinite().all()
            ]
    except SafetensorError as exc:
        raise ValueError(f"{path} is not a readable safetensors file ({exc}): {REEXPORT}") from None


def _config_problems(cfg: dict[str, Any]) -> list[str]:
    problems = []
    if cfg.get("architectures") not in ([ARCHITECTURE], [MLA_ARCHITECTURE]):
        problems.append(
            f"architectures is {cfg.get('architectures')}, SGLang needs [{ARCHITECTURE!r}] "
            f"(or [{MLA_ARCHITECTURE!r}] for an MLA draft)"
        )
    if cfg.get("num_hidden_layers") != 1:
        problems.append(
            f"num_hidden_layers is {cfg.get('num_hidden_layers')}, an EAGLE-3 draft has 1"
        )
    if cfg.get("tie_word_embeddings") is not False:
        problems.append(
            "tie_word_embeddings must be false (SGLang would replace lm_head by the embedding)"
        )
    eagle = cfg.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if not (isinstance(ids, list) and len(ids) == 3 and all(isinstance(i, int) for i in ids)):
        problems.append(
            f"eagle_config.eagle_aux_hidden_state_layer_ids is {ids!r}: write 3 ids (output_of_layer)"
        )
    if eagle.get("use_aux_hidden_state") is not True:
        problems.append("eagle_config.use_aux_hidden_state must be true")
    sizes = MLA_SIZES if is_mla(cfg) else ("num_key_value_heads",)
    needed = (
        "hidden_size",
        "num_attention_heads",
        *sizes,
        "intermediate_size",
        "vocab_size",
        "draft_vocab_size",
        "max_position_embeddings",
    )
    missing = [k for k in needed if k not in cfg]
    problems += [f"lacks {k}" for k in missing]
    return problems


def _tensor_problems(export: DraftExport) -> list[str]:
    want = expected_shapes(export.config)
    problems = [f"missing tensor {k}" for k in sorted(set(want) - set(export.shapes))]
    problems += [
        f"unexpected tensor {k} (SGLang would silently drop it)"
        for k in sorted(set(export.shapes) - set(want))
    ]
    problems += [
        f"{k} has shape {list(export.shapes[k])}, config.json implies {list(shape)}"
        for k, shape in want.items()
        if k in export.shapes and export.shapes[k] != shape
    ]
    if problems or export.d2t is None:
        return problems
    return vocab_problems(export.d2t, export.t2d, export.config["vocab_size"])


def validate_export(export_dir: Path) -> list[str]:
    """Every problem that would make SGLang serve this draft wrongly, each naming its file and the
    fix; an empty list means the export is sound."""
    export_dir = Path(export_dir)
    missing = missing_files(export_dir)
    if missing:
        return [f"{path} is missing: {REEXPORT}" for path in missing]
    try:
        export = load_export(export_dir)
    except ValueError as exc:  # unreadable config.json or weights: itself the problem
        return [str(exc)]
    problems = [
        f"{export_dir / CONFIG_FILE}: {p}: {REEXPORT}" for p in _config_problems(export.config)
    ]
    if problems:
        return problems
    return [f"{export_dir / WEIGHTS_FILE}: {p}: {REEXPORT}" for p in _tensor_problems(export)]


def load_draft(export_dir: Path) -> tuple[DraftModel, torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Load an export for evaluation: ``(DraftModel in eval mode, d2t, t2d, config.json)``;
    validates first."""
    export_dir = Path(export_dir)
    problems = validate_export(export_dir)
    if problems:
        raise ValueError(f"{export_dir} is not a valid EAGLE-3 export:\n  " + "\n  ".join(problems))
    cfg = json.loads((export_dir / CONFIG_FILE).read_text())
    tensors = rename_layer(load_file(str(export_dir / WEIGHTS_FILE)), to_export=False)
    if full_vocab(cfg):  # the target's ids: the identity maps
        d2t = torch.zeros(cfg["vocab_size"], dtype=torch.int64)
        t2d = torch.ones(cfg["vocab_size"], dtype=torch.bool)
    else:
        d2t, t2d = tensors.pop("d2t"), tensors.pop("t2d")
    model = DraftModel(draft_config_from_export(cfg))
    model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return model.eval(), d2t, t2d, cfg


def card_metadata(config: PipelineConfig) -> dict[str, Any]:
    """The card's Hub YAML metadata; ``base_model`` is the target's Hub id (``export.base_model``
    for a target served from a local directory, which the Hub could not link)."""
    base = config.export.base_model or config.target.model_path
    meta: dict[str, Any] = {
        "license": config.export.license,
        "library_name": CARD_LIBRARY,
        "tags": list(CARD_TAGS),
    }
    if HUB_ID.match(base) and not Path(base).expanduser().exists():
        meta["base_model"] = base
    return meta


def front_matter(config: PipelineConfig) -> str:
    """The ``---``-fenced YAML block a Hub model card starts with."""
    return "---\n" + yaml.safe_dump(card_metadata(config), sort_keys=False) + "---\n\n"
