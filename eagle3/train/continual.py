"""Nights that build on the champion (``train.init=champion``): how tonight's draft starts and what
it trains on.

Design choices:

* **Start from the champion's weights, not its optimizer.** The promoted export
  (``<root>/registry``) holds the draft's weights and vocab maps only; AdamW starts fresh, with a
  fine-tuning schedule: peak lr ``train.lr x train.champion_lr_scale``, the same warmup ratio and
  cosine decay, over the shorter run.
* **New rows = rows of feature shards the champion never saw.** Every draft records the feature
  shards (name and sha256) of the set it was planned over (``trained_on.json``, in its directory and
  its export, so the registry's copy of a champion carries it). A shard is a night's unit (nights
  add whole shards to one features directory and never rewrite one), so tonight's new rows are the
  shards of tonight's manifest not in the champion's record.
* **Replay by sample id.** ``train.replay`` is the share of tonight's training rows drawn from rows
  the champion already trained on: ``round(new x replay / (1 - replay))`` of them (all, when fewer),
  the ones whose ``sha256(seed:sample_id)`` is smallest, so the choice does not depend on file order
  and a re-run picks the same.
* **The vocab stays the champion's.** The champion's ``d2t``/``t2d`` are the draft's maps tonight
  (its ``lm_head`` rows mean those ids). When the config asks for another draft vocab size, a new
  mapping is needed: the night says so and trains from scratch. With no champion yet, likewise.
* **EAGLE-3 -> EAGLE 3.1.** A 3.0 champion starts a 3.1 draft (``train.architecture``): every tensor
  it has keeps its role, and the norms 3.1 adds (``fc_norm.*``, ``input_norm``) start as a fresh
  draft's do, at ones. That is not the champion's forward (a per-token RMS cannot be folded into
  ``fc``), so the night says so in its start line; ``benchmarks/continual_nights.py
  --architecture-after eagle3.1`` measures it against a 3.1 draft from scratch. The reverse (a 3.1
  champion, a 3.0 night) would drop trained norms and is refused.
* **Refused before training.** A champion that cannot start the draft (pointer to a missing copy, an
  invalid export, another target, another architecture or layer ids, no record of its data, nothing
  new to train on) raises ``ChampionError`` at plan time, one line naming the fix. A re-run of the
  night whose own draft was promoted (a night killed after its gate, or re-triggered) is not
  "nothing new": the champion trained on exactly tonight's shards, and its recorded start puts
  tonight's plan in its own draft dir, so the plan takes that start and finds the draft done.
* **Reproducible.** The start (champion id, replay share, lr scale) enters the draft fingerprint;
  the rows follow from the feature set (in the vocab's fingerprint), the champion's record and the
  seed. A scratch night adds nothing, so existing drafts keep their fingerprints.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from eagle3.config.pipeline import PipelineConfig
from eagle3.model.export_format import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    draft_config_from_export,
    validate_export,
)
from eagle3.model.export_mla import rename_layer
from eagle3.registry import Registry
from eagle3.rundir.layout import stage_dir
from eagle3.rundir.runroot import Manifest, atomic_path, atomic_write_json
from eagle3.target_io import load_hf_config
from eagle3.train.identity import draft_config_for, draft_fingerprint

# in a draft dir: how the draft starts and which rows it trains on (before training)
START_FILE = "start.json"
# in a draft dir and its export: the feature shards the draft has seen
TRAINED_ON = "trained_on.json"
CHAMPION_VOCAB = "vocab.safetensors"  # in a champion-started draft dir: the champion's maps
SCRATCH_FIX = "set train.init=scratch for tonight"
# the tensors EAGLE 3.1 adds to an EAGLE-3 draft (eagle3.model.draft)
NEW_NORMS = ("fc_norm.", "input_norm.")

logger = logging.getLogger(__name__)


class ChampionError(ValueError):
    """The champion cannot start tonight's draft; the message is one line that names the fix."""


@dataclass(frozen=True)
class Start:
    """How tonight's draft starts. ``mode`` is what runs (``scratch`` when ``champion`` was asked
    but cannot be used without refusing, ``note`` says why)."""

    mode: str = "scratch"
    note: str = ""
    champion_id: str | None = None
    champion_dir: str | None = None
    replay: float = 0.0
    lr_scale: float = 1.0
    new_rows: int = 0
    old_rows: int = 0  # rows the champion trained on that tonight's features still hold
    replay_ids: list[str] = field(default_factory=list)
    # shard file name -> rows trained on tonight
    rows: dict[str, list[int]] = field(default_factory=dict)

    @property
    def champion(self) -> bool:
        return self.mode == "champion"

    def identity(self) -> dict[str, Any] | None:
        """What enters the draft fingerprint: None for scratch (fingerprints of scratch drafts stay
        as they were)."""
        if not self.champion:
            return None
        return {
            "init": "champion",
            "champion": self.champion_id,
            "replay": self.replay,
            "lr_scale": self.lr_scale,
        }

    def summary(self) -> dict[str, Any]:
        """The small dict the night summary shows."""
        return {
            "init": self.mode,
            "champion": self.champion_id,
            "replay": self.replay,
            "new_rows": self.new_rows,
            "replay_rows": len(self.replay_ids),
            "note": self.note,
        }

    def write(self, draft_dir: Path) -> Path:
        path = Path(draft_dir) / START_FILE
        atomic_write_json(path, asdict(self))
        return path

    @classmethod
    def read(cls, draft_dir: Path) -> Start:
        """The start recorded in a draft dir; none recorded: scratch (a draft trained before starts
        were recorded)."""
        path = Path(draft_dir) / START_FILE
        return cls(**json.loads(path.read_text())) if path.exists() else cls()


def start_line(start: dict[str, Any]) -> str:
    """One Markdown line for the night summary and plan: the init mode, the champion, the replay
    share."""
    note = f" ({start['note']})" if start.get("note") else ""
    if start.get("init") != "champion":
        return f"- training: from scratch on every row so far{note}"
    return (
        f"- training: built on champion `{start['champion']}`: {start['new_rows']:,} new rows + "
        f"{start['replay_rows']:,} replayed (replay share {start['replay']:g}){note}"
    )


def planned_start_line(config: PipelineConfig) -> str:
    """The plan's line before regen: which init tonight asks for and the champion it would build
    on."""
    if config.train.init == "scratch":
        return "- training: `train.init=scratch` (a fresh draft on every row so far)"
    champion = Registry(config.root_path).read_pointer()
    none = "no champion yet (this night trains from scratch)"
    on = f"champion `{champion.draft_id}`" if champion else none
    return (
        f"- training: `train.init=champion` on {on}, replay share {config.train.replay:g}, "
        f"lr x {config.train.champion_lr_scale:g}"
    )


def trained_on(features_dir: Path) -> dict[str, str]:
    """The feature shards (file name -> sha256) a draft planned over ``features_dir`` has seen."""
    manifest = Manifest.read(Path(features_dir))
    if manifest is None:
        raise FileNotFoundError(f"{features_dir}: no manifest.json; run `eagle3 capture` first")
    return {Path(f.path).name: f.sha256 for f in manifest.files}


def record_trained_on(config: PipelineConfig, features_dir: Path, draft_dir: Path) -> Path:
    path = Path(draft_dir) / TRAINED_ON
    atomic_write_json(path, {"target": _target_id(config), "shards": trained_on(features_dir)})
    return path


def _target_id(config: PipelineConfig) -> dict[str, Any]:
    return {"model_path": config.target.model_path, "revision": config.target.revision}


def plan_start(config: PipelineConfig, features_dir: Path, *, vocab_name: str = "") -> Start:
    """Tonight's start by ``train.init``; raises ``ChampionError`` (before any training) when the
    champion cannot start it. ``vocab_name``: the vocab stage dir's name (the draft fingerprint's),
    to recognise a re-run of the night whose own draft is the champion."""
    if config.train.init == "scratch":
        return Start()
    registry = Registry(config.root_path)
    champion = registry.read_pointer()
    if champion is None:
        return Start(note="train.init=champion, but no draft has been promoted yet")
    export, champion_id = Path(champion.draft_dir), champion.draft_id
    if not export.exists():
        raise ChampionError(
            f"train.init=champion: {registry.pointer} points at {export}, which "
            f"is gone: restore it or promote another draft, or {SCRATCH_FIX}"
        )
    cfg = check_champion(config, export, champion_id)
    if cfg["draft_vocab_size"] != config.vocab.draft_vocab_size:
        return Start(
            note=f"a new vocab mapping is needed: vocab.draft_vocab_size={config.vocab.draft_vocab_size}, "
            f"the champion's is {cfg['draft_vocab_size']}"
        )
    seen = _seen(config, export, champion.source_dir, champion_id)
    own = _own_start(config, Path(features_dir), vocab_name, champion.source_dir, seen)
    if own is not None:
        return own
    start = _replay_plan(config, Path(features_dir), seen, champion_id, str(export))
    added = _added_norms(config, export, cfg)
    if not added:
        return start
    return replace(
        start,
        note=f"an EAGLE-3 champion starting an EAGLE 3.1 draft: its {len(added)} new norm "
        f"tensors start at ones, so step 0 is not the champion's forward",
    )


def _own_start(
    config: PipelineConfig,
    features_dir: Path,
    vocab_name: str,
    source_dir: str,
    seen: dict[str, str],
) -> Start | None:
    """The champion's recorded start when the champion is tonight's own draft (a re-run of the night
    that promoted it): it trained on exactly tonight's shards, and that start puts tonight's draft
    fingerprint in its draft dir."""
    if not source_dir or seen != trained_on(features_dir):
        return None
    draft_dir, start = Path(source_dir).parent, Start.read(Path(source_dir).parent)
    fp = draft_fingerprint(config, features_dir.name, vocab_name, start.identity())
    if stage_dir(config.root_path, "train", fp).resolve() != draft_dir.resolve():
        return None
    logger.info(
        "train.init=champion: the champion is this night's own draft %s (a re-run): reusing it", fp
    )
    return start


def check_champion(config: PipelineConfig, export: Path, champion_id: str) -> dict[str, Any]:
    """The champion's ``config.json`` once it is a valid export of this target's draft architecture
    and layers."""
    where = f"train.init=champion: the champion {champion_id} ({export})"
    problems = validate_export(export)
    if problems:
        raise ChampionError(
            f"{where} is not a valid export ({problems[0]}): promote a valid draft or {SCRATCH_FIX}"
        )
    cfg = json.loads((export / CONFIG_FILE).read_text())
    target = config.target
    target_h = cfg.get("target_hidden_size", cfg["hidden_size"])
    if (cfg["vocab_size"], target_h) != (target.vocab_size, target.hidden_size):
        raise ChampionError(
            f"{where} was trained for another target (vocab {cfg['vocab_size']}, hidden {target_h}; "
            f"this target: {target.vocab_size}, {target.hidden_size}): {SCRATCH_FIX}"
        )
    layers = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if layers != config.export_layer_ids:
        raise ChampionError(
            f"{where} reads aux layers {layers}, this config captures {config.export_layer_ids}: "
            f"train on features of the champion's layers or {SCRATCH_FIX}"
        )
    _check_architecture(config, export, cfg, where)
    return cfg


def _tensor_shapes(config: PipelineConfig, export: Path, cfg: dict[str, Any]) -> tuple[dict, dict]:
    """(the champion's tensors, tonight's draft's tensors) as name -> shape, vocab maps left out."""
    from safetensors import safe_open

    from eagle3.model.draft import DraftModel

    hf_config = load_hf_config(config.target)
    ours = draft_config_for(config, hf_config, draft_vocab_size=cfg["draft_vocab_size"])
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in DraftModel(ours).state_dict().items()}
    with safe_open(str(export / WEIGHTS_FILE), framework="pt") as fh:
        names = [k for k in list(fh.keys()) if k not in ("d2t", "t2d")]
        have = rename_layer({k: tuple(fh.get_slice(k).get_shape()) for k in names}, to_export=False)
    return have, want


def _added_norms(config: PipelineConfig, export: Path, cfg: dict[str, Any]) -> list[str]:
    """The EAGLE 3.1 norms tonight's draft has and the (EAGLE-3) champion has not."""
    have, want = _tensor_shapes(config, export, cfg)
    return sorted(want.keys() - have.keys())


def _check_architecture(
    config: PipelineConfig, export: Path, cfg: dict[str, Any], where: str
) -> None:
    """The champion's tensors are the ones tonight's draft has (names and shapes), or all of them
    but the norms EAGLE 3.1 adds (an EAGLE-3 champion starting a 3.1 draft)."""
    have, want = _tensor_shapes(config, export, cfg)
    added = want.keys() - have.keys()
    if have.items() <= want.items() and all(k.startswith(NEW_NORMS) for k in added):
        return
    diff = sorted(set(have.items()) ^ set(want.items()))[:3]
    raise ChampionError(
        f"{where} has another draft architecture (differing tensors {diff}; champion "
        f"{draft_config_from_export(cfg)}): {SCRATCH_FIX}"
    )


def _seen(
    config: PipelineConfig, export: Path, source_dir: str, champion_id: str
) -> dict[str, str]:
    """The champion's ``trained_on.json`` shards (its registry copy, else its training run's draft
    dir)."""
    for path in (
        export / TRAINED_ON,
        *([Path(source_dir).parent / TRAINED_ON] if source_dir else []),
    ):
        if path.exists():
            record = json.loads(path.read_text())
            if record["target"] != _target_id(config):
                raise ChampionError(
                    f"train.init=champion: the champion {champion_id} was trained for target "
                    f"{record['target']}, not {_target_id(config)}: {SCRATCH_FIX}"
                )
            return dict(record["shards"])
    raise ChampionError(
        f"train.init=champion: the champion {champion_id} has no {TRAINED_ON} (its data is "
        f"unknown): promote a draft that records it, or {SCRATCH_FIX}"
    )


def _replay_plan(
    config: PipelineConfig,
    features_dir: Path,
    seen: dict[str, str],
    champion_id: str,
    champion_dir: str,
) -> Start:
    """Every row of the shards the champion has not seen, plus the replay sample of the ones it
    has."""
    manifest = Manifest.read(features_dir)
    if manifest is None:
        raise FileNotFoundError(f"{features_dir}: no manifest.json; run `eagle3 capture` first")
    shards = {Path(f.path).name: f for f in manifest.files}
    new = sorted(name for name, f in shards.items() if seen.get(name) != f.sha256)
    old = sorted(set(shards) - set(new))
    new_rows = sum(shards[name].rows for name in new)
    if new_rows == 0:
        raise ChampionError(
            f"train.init=champion: the champion {champion_id} has trained on every row of "
            f"{features_dir}: add prompts tonight (--scale) or {SCRATCH_FIX}"
        )
    ids = {name: _sample_ids(features_dir / shards[name].path) for name in old}
    where = {sid: (name, row) for name in old for row, sid in enumerate(ids[name])}
    chosen = replay_sample(list(where), new_rows, config.train.replay, seed=config.train.seed)
    rows = {name: list(range(shards[name].rows)) for name in new}
    for name, row in sorted(where[sid] for sid in chosen):
        rows.setdefault(name, []).append(row)
    return Start(
        mode="champion",
        champion_id=champion_id,
        champion_dir=champion_dir,
        replay=config.train.replay,
        lr_scale=config.train.champion_lr_scale,
        new_rows=new_rows,
        old_rows=len(where),
        rows=rows,
        replay_ids=sorted(chosen),
    )


def replay_sample(old_ids: list[str], new_rows: int, replay: float, *, seed: int) -> list[str]:
    """The earlier rows a night replays: ``round(new_rows x replay / (1 - replay))`` of ``old_ids``
    (all, when fewer), those with the smallest ``sha256(seed:sample_id)`` (independent of file
    order)."""
    wanted = round(new_rows * replay / (1 - replay))
    return sorted(old_ids, key=lambda sid: hashlib.sha256(f"{seed}:{sid}".encode()).hexdigest())[
        :wanted
    ]


def _sample_ids(shard: Path) -> list[str]:
    import pyarrow.parquet as pq

    return [str(s) for s in pq.read_table(shard, columns=["sample_id"]).column(0).to_pylist()]


def write_champion_vocab(start: Start, path: Path) -> Path:
    """The champion's ``d2t``/``t2d`` as tonight's vocab file (what the trainer and export read)."""
    assert start.champion_dir is not None
    tensors = load_file(str(Path(start.champion_dir) / WEIGHTS_FILE))
    if "d2t" not in tensors:  # a full-vocab champion: the identity maps
        vocab = json.loads((Path(start.champion_dir) / CONFIG_FILE).read_text())["vocab_size"]
        tensors = {
            "d2t": torch.zeros(vocab, dtype=torch.int64),
            "t2d": torch.ones(vocab, dtype=torch.bool),
        }
    with atomic_path(Path(path)) as tmp:
        save_file({"d2t": tensors["d2t"].long(), "t2d": tensors["t2d"].bool()}, str(tmp))
    return Path(path)


def champion_weights(start: Start) -> dict[str, torch.Tensor]:
    """The champion's draft weights (float32, no vocab maps): tonight's step-0 weights."""
    assert start.champion_dir is not None
    tensors = rename_layer(load_file(str(Path(start.champion_dir) / WEIGHTS_FILE)), to_export=False)
    return {k: v.float() for k, v in tensors.items() if k not in ("d2t", "t2d")}
