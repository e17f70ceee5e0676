"""The run root's layout: every stage directory and file name, the shard naming rule, and the one
input rule.

A run root holds one directory per stage and fingerprint::

    <root>/catalog/<fp>/   discover    catalog.json
    <root>/prompts/<fp>/   normalize   shard-NNNNN.parquet, quarantine.parquet, spill/<source>/
    <root>/selection/<fp>/ select      pool.json, eval.parquet, nights.json, shard-NNNNN.parquet: the rows the
                                       aimed nights chose (scaling.policy aimed: regen reads these, not prompts/)
    <root>/regen/<fp>/     regen       shard-NNNNN.parquet (+ failed-NNNNN.parquet, dropped-NNNNN.parquet:
                                       truncated rows set aside), plan.json, config.yaml, failed_shards.json
    <root>/features/<fp>/  capture     shard-NNNNN.parquet, quarantine-NNNNN.parquet, hashes-NNNNN.json (their
                                       writer's hashes), parts-NNNNN/ while running
    <root>/vocab/<fp>/     vocab       vocab.safetensors
    <root>/drafts/<fp>/    train       ckpt/step-NNNNNN/, ckpt/latest, metrics.jsonl; export/ (the export stage)
    <root>/gate/<fp>/      gate        report.json, report.md, *.png
    <root>/scaling/        scaling     curve.jsonl, curve.png (one ledger per run root, no fingerprint)

A stage directory is finished when its ``manifest.json`` exists
(``eagle3.rundir.runroot.Manifest``). A stage run that succeeded also leaves ``result-<stage>-<plan
key>.json`` in its directory: the result of that exact plan, read back instead of running it again
(``eagle3.stage.recorded_result``).

**The input rule.** A stage reads the directory of its upstream stage whose fingerprint is the one
the resolved config gives (the caller computes it); an explicit path always wins; when no such
directory is finished, the error lists what exists under that stage and how to point at it. Nothing
is ever picked "newest by mtime".
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from eagle3.rundir.runroot import MANIFEST, Manifest, atomic_write_json, fingerprint

# stage name -> its directory under the run root (train and export share the draft's directory)
STAGE_DIRS: dict[str, str] = {
    "discover": "catalog",
    "normalize": "prompts",
    "select": "selection",
    "regen": "regen",
    "capture": "features",
    "vocab": "vocab",
    "train": "drafts",
    "export": "drafts",
    "gate": "gate",
    "scaling": "scaling",
    "profile": "profile",  # the gate's served traffic profile (eagle3.gate.served_profile)
}

# The upstream a regen stage reads: the prompts stage, or the aimed nights' selection
# (``eagle3.lineage`` decides).
REGEN_INPUT = "regen-input"
CATALOG_FILE = "catalog.json"
PLAN_FILE = "plan.json"
CONFIG_FILE = "config.yaml"  # the resolved config a stage directory was run with
FAILED_SHARDS_FILE = "failed_shards.json"
VOCAB_FILE = "vocab.safetensors"
CKPT_DIR = "ckpt"
EXPORT_DIR = "export"
METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "curve.jsonl"

_SHARD_RE = re.compile(r"^(?P<kind>[a-z]+)-(?P<index>\d{5})\.parquet$")
SHARD_GLOB = "shard-[0-9][0-9][0-9][0-9][0-9].parquet"


def stage_result_file(stage: str, plan_key: str) -> str:
    """``result-<stage>-<plan key>.json``: a finished run's result (train and export share a
    directory)."""
    return f"result-{stage}-{plan_key}.json"


def shard_name(index: int, kind: str = "shard") -> str:
    """``shard-00003.parquet`` (or ``failed-00003.parquet``, ``quarantine-00003.parquet`` for
    ``kind``)."""
    return f"{kind}-{index:05d}.parquet"


def parts_dir_name(index: int) -> str:
    """``parts-00003``: the directory holding shard ``index``'s capture part files while it is
    captured."""
    return f"parts-{index:05d}"


def hashes_file_name(index: int) -> str:
    """``hashes-00003.json``: the sizes and hashes capture shard ``index``'s writer computed for its
    files."""
    return f"hashes-{index:05d}.json"


def shard_index(path: Path | str, kind: str = "shard") -> int | None:
    """The index of a ``<kind>-NNNNN.parquet`` file name, None for any other name."""
    match = _SHARD_RE.match(Path(path).name)
    if match is None or match.group("kind") != kind:
        return None
    return int(match.group("index"))


def shard_files(directory: Path | str) -> dict[int, Path]:
    """The ``shard-NNNNN.parquet`` files of a directory by index (on disk; finished or not is the
    caller's check)."""
    directory = Path(directory)
    found = {shard_index(p): p for p in directory.glob(SHARD_GLOB)} if directory.is_dir() else {}
    return {i: p for i, p in sorted(found.items()) if i is not None}


def stage_root(root: Path | str, stage: str) -> Path:
    """``<root>/<stage dir>``: the parent of every fingerprint directory of ``stage``."""
    if stage not in STAGE_DIRS:
        raise KeyError(f"unknown stage {stage!r}; stages: {', '.join(STAGE_DIRS)}")
    return Path(root) / STAGE_DIRS[stage]


def stage_dir(root: Path | str, stage: str, fp: str) -> Path:
    """``<root>/<stage dir>/<fingerprint>``."""
    return stage_root(root, stage) / fp


class StageInputError(FileNotFoundError):
    """A stage's input is missing or unfinished; the message lists what exists and how to point at
    it."""


def describe_existing(root: Path | str, stage: str) -> str:
    """One line per fingerprint directory of ``stage`` under ``root``: finished or not (for error
    messages)."""
    base = stage_root(root, stage)
    dirs = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if not dirs:
        return f"nothing exists under {base}"
    lines = [f"  {d} ({'finished' if (d / MANIFEST).exists() else 'not finished'})" for d in dirs]
    return f"{base} holds:\n" + "\n".join(lines)


def _is_ready(path: Path, marker: str | None) -> bool:
    return (path / marker).exists() if marker else Manifest.read(path) is not None


def find_input(
    root: Path | str,
    stage: str,
    fp: str | None,
    *,
    explicit: Path | str | None = None,
    option: str,
    produce: str,
    marker: str | None = None,
) -> Path:
    """The directory of ``stage`` that a downstream stage reads.

    ``explicit`` (a path the user gave) wins; otherwise the directory named by ``fp`` (the
    fingerprint the resolved config gives). Either must be ready: finished (its manifest), or
    holding ``marker`` when a downstream stage may read it while it runs (capture reads the ready
    shards of a planned regen stage). ``option`` names the flag that points at another directory,
    ``produce`` the command that makes this one.
    """
    what = (
        f"a planned {stage} stage directory (no {marker})"
        if marker
        else f"a finished {stage} stage directory"
    )
    if explicit is not None:
        path = Path(explicit)
        if not _is_ready(path, marker):
            raise StageInputError(
                f"{path} is not {what}: run `{produce}` for it or pass another {option}"
            )
        return path
    if fp is not None and _is_ready(stage_dir(root, stage, fp), marker):
        return stage_dir(root, stage, fp)
    wanted = f"{stage_dir(root, stage, fp)} " if fp is not None else ""
    state = "planned" if marker else "finished"
    raise StageInputError(
        f"the {stage} stage {wanted}of this config is not {state}: run `{produce}` with the same config, or pass "
        f"{option} DIR to use another one. {describe_existing(root, stage)}"
    )


def write_failed_shards(out_dir: Path | str, units: Sequence[int | str]) -> None:
    """``failed_shards.json``: the units (shard ids, or source names) of a stage that failed in its
    last run (``[]`` when none)."""
    atomic_write_json(
        Path(out_dir) / FAILED_SHARDS_FILE, sorted(set(units), key=lambda u: (str(type(u)), u))
    )


def read_failed_shards(out_dir: Path | str) -> list[int | str]:
    path = Path(out_dir) / FAILED_SHARDS_FILE
    return list(json.loads(path.read_text())) if path.exists() else []


def feature_set_fingerprint(features_dir: Path | str) -> str:
    """Identity of the feature shards a features manifest lists: the directory's fingerprint plus
    each file's checksum.

    One features directory serves every night (each night adds shards to it), so the stages after
    capture (vocab, then train through the vocab fingerprint) key on this, not on the directory
    name: otherwise night 2 would reuse night 1's vocab and draft. Re-running a night lists the same
    shards, hence the same fingerprint.
    """
    features_dir = Path(features_dir)
    manifest = Manifest.read(features_dir)
    if manifest is None:
        raise FileNotFoundError(f"{features_dir}: no manifest.json; run `eagle3 capture` first")
    return fingerprint(features_dir.name, sorted((f.path, f.sha256) for f in manifest.files))
