"""Preflight: refuse a draft/launch pair that cannot work before anyone benchmarks or ships it
(docs/DESIGN.md, "Preflight").

Design choices:
- Every check returns ``Check(name, ok, message)``; a failing message is one line that names the
  problem and the fix. Checks never raise on bad input: a missing file is a failed check, so one run
  lists every problem.
- The export format (file names, key set and shapes, the d2t/t2d rules) is
  ``eagle3.model.export_format``, the one definition for writing and checking; preflight splits it
  into named checks (``draft_keys``, ``fc_shape``, ``draft_shapes``, ``d2t_order``...) so a failure
  names its fix.
- EAGLE 3.1 (``draft_variant``): the ``fc_norm``/``norm_before_fc`` flags must match the norm
  weights in the file, both ways; SGLang loads either mismatch without a word and serves another
  draft than the trained one.
- A NaN-trained or damaged draft has the right keys and shapes: ``weights_finite`` loads every
  tensor, and, given the features, ``offline_accept`` runs the draft on a few captured rows (CPU,
  the target's saved states) and requires ``gate.min_accept`` (simulated), so such a draft fails
  here, not after a GPU benchmark.
- Static checks read only files: the export dir (``config.json`` + the safetensors header for
  shapes; ``d2t``/``t2d`` are the only tensors loaded), the target's ``config.json`` when it is a
  local dir, the capture footer, and the two launch commands. Runtime checks
  (``eagle3.gate.preflight_runtime``) ask a live server (``/server_info``) and run a smoke
  benchmark.
- The real failure this exists for: a good EAGLE-3 draft served with ``--speculative-algorithm
  EAGLE``. SGLang then sends the draft the last hidden state only (H wide), silently skips ``fc``
  because widths match, and accept length falls to ~1.0. The algorithm check catches the flag; the
  smoke accept-length check catches it live.
- Layer ids: the capture footer records ids in ``input_of_layer`` (SGLang's capture convention); a
  draft's ``eagle_aux_hidden_state_layer_ids`` are ``output_of_layer``, which SGLang maps back by
  the target family's rule (``eagle3.config.aux_layers.served_layer_ids``: Llama-like +1 always,
  DeepSeek/Kimi +1 only when the first id is 1). The served layers must equal the captured ones, or
  the draft sees other layers than it was trained on.
- Batch limit: both arms must pass the same ``--max-running-requests``; left out, SGLang caps only
  the speculative arm (at 48), and the comparison at high concurrency measures the cap, not
  speculation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle3.config.aux_layers import served_layer_ids, to_sglang_ids
from eagle3.config.pipeline import PipelineConfig
from eagle3.data.parquet import ShardError, shard_metadata
from eagle3.model.export_format import (
    ARCHITECTURE,
    MLA_ARCHITECTURE,
    WEIGHTS_FILE,
    DraftExport,
    expected_shapes,
    full_vocab,
    load_export,
    non_finite_tensors,
    served_flags,
    variant_problems,
    vocab_problems,
)
from eagle3.rundir.layout import shard_files
from eagle3.serve.launch_commands import (
    ALGORITHM_FLAG,
    DRAFT_FLAG,
    MAX_RUNNING_FLAG,
    LaunchCommand,
    split_speculative,
    without_address,
)

logger = logging.getLogger(__name__)

EXPECTED_ALGORITHM = "EAGLE3"
SMOKE_MIN_ACCEPT = 1.5
OFFLINE_ROWS = 4  # captured rows of the offline acceptance smoke: seconds on CPU for a tiny draft
# Below this accept length a draft adds almost nothing: the signature of a damaged or untrained draft
# (offline), or of one that gets no aux hidden states (live: EAGLE for EAGLE3, wrong layer ids).
# Above it, under the floor, a draft that works but is weak.
BLIND_ACCEPT = 1.1
WEAK_DRAFT = (
    "the draft speculates but accepts too little to pay for its draft steps: train it on more data, "
    "or lower gate.min_accept to measure its speedup anyway"
)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]


# ---------------------------------------------------------------------------------------------------------------
# Launch-command checks
# ---------------------------------------------------------------------------------------------------------------


def check_algorithm(spec: LaunchCommand) -> Check:
    _, flags = split_speculative(spec.server_args())
    algo = flags.get(ALGORITHM_FLAG)
    if algo == EXPECTED_ALGORITHM:
        return Check("algorithm", True, f"{ALGORITHM_FLAG} {algo}")
    hint = (
        " (EAGLE sends the draft the last hidden state only: fc is skipped silently and accept length is ~1.0)"
        if algo == "EAGLE"
        else ""
    )
    return Check(
        "algorithm",
        False,
        f"{ALGORITHM_FLAG} is {algo!r}, not {EXPECTED_ALGORITHM!r}{hint}: set speculative.algorithm=EAGLE3",
    )


def check_arms_match(baseline: LaunchCommand, spec: LaunchCommand) -> Check:
    """The arms may differ only in ``--speculative-*`` flags (and where they listen), and both set
    the batch limit."""
    base_shared, base_spec = split_speculative(without_address(baseline.server_args()))
    spec_shared, _ = split_speculative(without_address(spec.server_args()))
    if base_spec:
        return Check(
            "arms_match",
            False,
            f"baseline arm carries speculative flags {sorted(base_spec)}: drop them",
        )
    if _flag(spec_shared, MAX_RUNNING_FLAG) is None:
        return Check(
            "arms_match",
            False,
            f"the speculative arm has no {MAX_RUNNING_FLAG}: SGLang then caps it at 48 running requests but not the "
            "baseline; pass the same server.max_running_requests to both arms (`eagle3 launch-sglang` does)",
        )
    if base_shared == spec_shared:
        return Check(
            "arms_match", True, "baseline and speculative arms share every non-speculative flag"
        )
    only_base = [t for t in base_shared if t not in spec_shared]
    only_spec = [t for t in spec_shared if t not in base_shared]
    return Check(
        "arms_match",
        False,
        f"arms differ beyond speculative flags (baseline only {only_base}, speculative only {only_spec}, or order): "
        "generate both with `eagle3 launch-sglang` from one config",
    )


def check_draft_path(spec: LaunchCommand, export_dir: Path) -> Check:
    _, flags = split_speculative(spec.server_args())
    served = flags.get(DRAFT_FLAG)
    if served and Path(served).expanduser().resolve() == Path(export_dir).resolve():
        return Check("draft_path", True, f"{DRAFT_FLAG} {served}")
    return Check(
        "draft_path",
        False,
        f"{DRAFT_FLAG} is {served!r}, not the checked export {export_dir}: fix the path",
    )


# ---------------------------------------------------------------------------------------------------------------
# Export checks
# ---------------------------------------------------------------------------------------------------------------


def check_architecture(export: DraftExport) -> Check:
    arch, layers = export.config.get("architectures"), export.config.get("num_hidden_layers")
    if arch in ([ARCHITECTURE], [MLA_ARCHITECTURE]) and layers == 1:
        return Check("architecture", True, f"{arch[0]}, 1 layer")
    return Check(
        "architecture",
        False,
        f"config.json has architectures={arch}, num_hidden_layers={layers}: "
        f're-export with architectures ["{ARCHITECTURE}"] and num_hidden_layers 1',
    )


def check_keys(export: DraftExport) -> Check:
    try:
        want = set(expected_shapes(export.config))
    except KeyError as exc:
        return Check("draft_keys", False, f"config.json lacks {exc.args[0]!r}: re-export the draft")
    have = set(export.shapes)
    missing, extra = sorted(want - have), sorted(have - want)
    if not missing and not extra:
        return Check("draft_keys", True, f"{len(have)} tensors, exactly the EAGLE-3 key set")
    return Check(
        "draft_keys",
        False,
        f"tensor keys off (missing {missing}, extra {extra}; SGLang drops unknown keys silently): "
        "re-export with `eagle3 export` so the key set is exact",
    )


def check_fc(export: DraftExport, target_hidden: int) -> Check:
    h = export.config.get("hidden_size")
    want = [h, 3 * target_hidden]
    shape = export.shapes.get("fc.weight")
    have = None if shape is None else list(shape)
    if have == want:
        return Check("fc_shape", True, f"fc.weight {have} = [H, 3*H_target]")
    return Check(
        "fc_shape",
        False,
        f"fc.weight is {have}, must be [H, 3*H_target] = {want} (SGLang skips fc silently when its input is H wide): "
        "train and export the draft on the 3 concatenated aux layers of this target",
    )


def check_variant(export: DraftExport) -> Check:
    """The EAGLE 3.1 flags against the norm weights in the file
    (``export_format.variant_problems``)."""
    problems = variant_problems(export.config, export.shapes)
    if problems:
        return Check("draft_variant", False, "; ".join(problems))
    on = [flag for flag, value in served_flags(export.config).items() if value]
    return Check(
        "draft_variant", True, f"EAGLE 3.1: {', '.join(on)}" if on else "EAGLE-3 (no 3.1 flags)"
    )


def check_shapes(export: DraftExport) -> Check:
    try:
        want = expected_shapes(export.config)
    except KeyError as exc:
        return Check(
            "draft_shapes", False, f"config.json lacks {exc.args[0]!r}: re-export the draft"
        )
    bad = {
        k: (export.shapes[k], v)
        for k, v in want.items()
        if k in export.shapes and export.shapes[k] != v
    }
    bad.pop("fc.weight", None)  # reported by fc_shape with its own fix
    if not bad:
        return Check("draft_shapes", True, "every tensor matches config.json")
    detail = ", ".join(
        f"{k} {list(have)} != {list(need)}" for k, (have, need) in sorted(bad.items())
    )
    return Check(
        "draft_shapes",
        False,
        f"tensor shapes disagree with config.json ({detail}): re-export the draft",
    )


def check_vocab(export: DraftExport, target_vocab: int) -> Check:
    cfg = export.config
    rows = (export.shapes.get("lm_head.weight") or [None])[0]
    n_d2t = None if export.d2t is None else int(export.d2t.numel())
    draft_vocab = cfg.get("draft_vocab_size")
    n_d2t = draft_vocab if n_d2t is None and full_vocab(cfg) else n_d2t  # the target's ids, no map
    if rows == draft_vocab == n_d2t and cfg.get("vocab_size") == target_vocab:
        return Check("draft_vocab", True, f"lm_head rows = draft_vocab_size = len(d2t) = {rows}")
    return Check(
        "draft_vocab",
        False,
        f"lm_head rows {rows}, draft_vocab_size {draft_vocab}, len(d2t) {n_d2t}, vocab_size {cfg.get('vocab_size')} "
        f"(target {target_vocab}) must agree: re-export with the vocab mapping the draft was trained with",
    )


def check_d2t(export: DraftExport, target_vocab: int) -> Check:
    if export.d2t is None and full_vocab(export.config):
        return Check("d2t_order", True, "full vocab: the draft's ids are the target's (no d2t)")
    if export.d2t is None:
        return Check(
            "d2t_order", False, "d2t is missing: export the vocab mapping (d2t, t2d) with the draft"
        )
    problems = vocab_problems(export.d2t, export.t2d, target_vocab)
    if problems:
        return Check(
            "d2t_order", False, f"{'; '.join(problems)}: rebuild the vocab stage and re-export"
        )
    return Check(
        "d2t_order",
        True,
        f"{export.d2t.numel()} draft ids map to ascending target ids inside the vocab",
    )


def capture_layer_ids(features_dir: Path) -> list[int]:
    """The capture's aux layer ids in ``input_of_layer`` convention, from the first shard's
    footer."""
    shards = list(shard_files(features_dir).values())
    if not shards:
        raise FileNotFoundError(
            f"no feature shards in {features_dir}: pass the capture stage dir (features/<fp>)"
        )
    meta = shard_metadata(shards[0])
    return to_sglang_ids(
        json.loads(meta["layer_ids"]), meta.get("layer_convention", "input_of_layer")
    )


def check_layer_ids(export: DraftExport, capture_ids: list[int], source: str, family: str) -> Check:
    """The layers SGLang serves the draft (by ``family``'s rule) must be the captured ones."""
    eagle = export.config.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if not ids or len(ids) != 3:
        return Check(
            "layer_ids",
            False,
            f"eagle_config.eagle_aux_hidden_state_layer_ids is {ids!r}: write the 3 capture layers in output_of_layer "
            f"convention ({[i - 1 for i in capture_ids]}), never rely on SGLang's default",
        )
    served = served_layer_ids(ids, family)
    if served != list(capture_ids):
        return Check(
            "layer_ids",
            False,
            f"draft layer ids {ids} (output_of_layer) are served on a {family} target as input_of_layer {served}, "
            f"but {source} captured {list(capture_ids)}: export eagle_aux_hidden_state_layer_ids="
            f"{[i - 1 for i in capture_ids]} (and, for a deepseek target, capture from layer 2)",
        )
    if not eagle.get("use_aux_hidden_state", False):
        return Check(
            "layer_ids",
            False,
            "eagle_config.use_aux_hidden_state is not true: set it in the export",
        )
    return Check(
        "layer_ids", True, f"draft ids {ids} = capture {list(capture_ids)} (input_of_layer)"
    )


def check_tied(export: DraftExport) -> Check:
    if export.config.get("tie_word_embeddings") is False:
        return Check("tie_word_embeddings", True, "false")
    return Check(
        "tie_word_embeddings",
        False,
        f"tie_word_embeddings is {export.config.get('tie_word_embeddings')!r}"
        ": the draft lm_head is its own (draft vocab), set tie_word_embeddings false in config.json",
    )


def check_context(export: DraftExport, served_context: int) -> Check:
    mpe = export.config.get("max_position_embeddings")
    if isinstance(mpe, int) and mpe >= served_context:
        return Check("max_position_embeddings", True, f"{mpe} >= served context {served_context}")
    return Check(
        "max_position_embeddings",
        False,
        f"max_position_embeddings {mpe} < served context {served_context}: re-export with "
        f"export.max_position_embeddings >= {served_context} or serve a shorter --context-length",
    )


def _heads(cfg: dict[str, Any]) -> tuple[int | None, int | None]:
    heads = cfg.get("num_attention_heads")
    return heads, cfg.get("num_key_value_heads") or heads


def check_tp_heads(export: DraftExport, target_config: dict[str, Any] | None, tp: int) -> Check:
    """Attention heads of target and draft must split evenly over tp (kv heads may be replicated
    instead)."""
    problems = []
    for who, cfg in (("target", target_config), ("draft", export.config)):
        if cfg is None:
            continue
        heads, kv = _heads(cfg)
        if heads is None or heads % tp:
            problems.append(f"{who} num_attention_heads {heads}")
        elif kv is not None and kv % tp and tp % kv:
            problems.append(f"{who} num_key_value_heads {kv}")
    if not problems:
        return Check("tp_heads", True, f"heads divide tp={tp}")
    return Check(
        "tp_heads",
        False,
        f"{', '.join(problems)} not divisible by tp={tp}: set server.tp to a divisor of the heads",
    )


def _flag(args: list[str], name: str) -> str | None:
    for i, token in enumerate(args):
        if token == name and i + 1 < len(args):
            return args[i + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    return None


def _target_config(config: PipelineConfig) -> dict[str, Any] | None:
    path = Path(config.target.model_path).expanduser() / "config.json"  # the target's HF config
    return json.loads(path.read_text()) if path.exists() else None


def check_weights_finite(export: DraftExport) -> Check:
    bad = non_finite_tensors(export.path / WEIGHTS_FILE)
    if bad:
        return Check(
            "weights_finite",
            False,
            f"NaN/inf in {', '.join(bad[:5])}: the draft is damaged or was trained on"
            " damaged data; retrain (the trainer names the bad batch) and re-export",
        )
    return Check("weights_finite", True, "every floating-point tensor is finite")


def check_offline_accept(config: PipelineConfig, export: DraftExport, features_dir: Path) -> Check:
    """The draft's simulated accept length on a few captured rows (CPU, the target's states, no
    server), so a damaged draft fails before any GPU time is spent."""
    from eagle3.train.evaluate import accept_on_features

    shard = next(iter(shard_files(features_dir).values()), None)
    if shard is None:
        raise FileNotFoundError(
            f"no feature shards in {features_dir}: pass the capture stage dir (features/<fp>)"
        )
    accept = accept_on_features(config, export.path, shard, rows=OFFLINE_ROWS)
    where, floor = f"{OFFLINE_ROWS} rows of {shard}", config.gate.min_accept
    if accept >= floor:
        return Check(
            "offline_accept", True, f"simulated accept length {accept:.2f} >= {floor} on {where}"
        )
    why = "the draft is damaged or untrained; retrain and re-export"
    if accept >= BLIND_ACCEPT:  # on its own training data, a working draft accepts more than this
        why = WEAK_DRAFT
    return Check(
        "offline_accept",
        False,
        f"simulated accept length {accept:.2f} < gate.min_accept {floor} on {where}: {why}",
    )


def run_offline(config: PipelineConfig, export_dir: Path, features_dir: Path) -> list[Check]:
    """The offline acceptance smoke (loads the draft, the target's embedding and head, a few
    captured rows); run after the static checks pass, never raises on a bad export."""
    try:
        export = load_export(export_dir)
    except (OSError, ValueError) as exc:
        return [Check("export_files", False, str(exc))]
    check = _guard("offline_accept", lambda: check_offline_accept(config, export, features_dir))
    if not check.ok:
        logger.warning("preflight %s", check.line())
    return [check]


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    """Run one check; a file it cannot read is that check's failure, not a crash of the whole
    preflight."""
    try:
        return fn()
    except (OSError, ValueError, KeyError, ShardError) as exc:
        return Check(name, False, f"{type(exc).__name__}: {exc}")


def run_static(
    config: PipelineConfig,
    export_dir: Path,
    *,
    baseline: LaunchCommand,
    spec: LaunchCommand,
    features_dir: Path | None = None,
) -> list[Check]:
    """Every static check (docs/DESIGN.md, "Preflight"); read-only, never raises on a bad export."""
    checks = [
        check_algorithm(spec),
        check_arms_match(baseline, spec),
        check_draft_path(spec, export_dir),
    ]
    try:
        export = load_export(export_dir)
    except (OSError, ValueError) as exc:
        return [*checks, Check("export_files", False, str(exc))]
    capture_source = (
        f"the capture footer in {features_dir}" if features_dir else "config capture.aux_layers"
    )
    args = spec.server_args()
    context = (
        _flag(args, "--context-length")
        or config.server.context_length
        or config.target.context_length
    )
    served_context = int(context)
    tp = int(_flag(args, "--tp-size") or config.server.tp)
    checks += [
        check_architecture(export),
        check_keys(export),
        check_variant(export),
        check_fc(export, config.target.hidden_size),
        check_shapes(export),
        check_vocab(export, config.target.vocab_size),
        check_d2t(export, config.target.vocab_size),
        _guard(
            "layer_ids",
            lambda: check_layer_ids(
                export,
                capture_layer_ids(features_dir) if features_dir else config.sglang_layer_ids,
                capture_source,
                config.target.family,
            ),
        ),
        check_tied(export),
        check_context(export, served_context),
        _guard("tp_heads", lambda: check_tp_heads(export, _target_config(config), tp)),
    ]
    checks.append(_guard("weights_finite", lambda: check_weights_finite(export)))
    from eagle3.gate import preflight_mla  # its rules import this module's Check

    checks += preflight_mla.checks(config, export, features_dir)
    for check in failed(checks):
        logger.warning("preflight %s", check.line())
    return checks
