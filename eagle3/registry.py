"""The draft registry: which draft is the champion, and how it got there.

The gate promotes into it (``eagle3.gate.release``); the train stage reads its champion to start a
night's draft from (``eagle3.train.continual``); the night, the gate and ``eagle3 push`` read the
champion. One module, below them all, reads the pointer as one typed record (``Promotion``).

Layout under ``<root>/registry/``::

    promoted.json            pointer to the champion (id, draft dir, metrics, gate report) -- replaced atomically
    history.jsonl            one line per promotion, appended and fsynced (the audit trail)
    drafts/<draft_id>/       a copy of every promoted export, so the champion survives its training run's cleanup

Design choices:
- The draft id is a content hash of the export's files that define the draft
  (``export_format.EXPORT_FILES``: ``config.json`` and ``model.safetensors``), so promoting the same
  draft twice reuses one copy, and a gate can tell "the candidate is the champion" by id, not by
  path.
- Promotion order: copy the export into ``drafts/<id>`` (tmp dir + rename), append the history line,
  then replace ``promoted.json`` (tmp + rename). A kill at any point leaves the old pointer or the
  new one; a history line without a pointer update is a promotion that did not take effect (its id
  is not the pointer's).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3.model.export_format import EXPORT_FILES, missing_files
from eagle3.rundir.runroot import atomic_write_json, fingerprint, fsync_dir, sha256_file
from eagle3.runtime.stop import raise_if_stopped

logger = logging.getLogger(__name__)

REGISTRY_DIR = "registry"  # under the run root
POINTER = "promoted.json"
HISTORY = "history.jsonl"


def draft_id(export_dir: Path) -> str:
    """Content id of an export: hash of its config and weights (paths and timestamps play no
    part)."""
    export_dir = Path(export_dir)
    missing = [path.name for path in missing_files(export_dir)]
    if missing:
        raise FileNotFoundError(
            f"{export_dir} lacks {missing}: pass an export dir written by the train stage"
        )
    return fingerprint(*(sha256_file(export_dir / name) for name in EXPORT_FILES))


@dataclass
class Promotion:
    """One promoted draft: where its copy lives, what it measured, which gate report promoted it."""

    draft_id: str
    draft_dir: str
    source_dir: str
    report: str
    metrics: dict[str, Any] = field(default_factory=dict)
    speculative: dict[str, Any] = field(default_factory=dict)
    promoted_at: float = field(default_factory=time.time)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Promotion:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class Registry:
    """Champion pointer + history of promoted drafts under ``<root>/registry``."""

    def __init__(self, root: Path | str) -> None:
        self.dir = Path(root) / REGISTRY_DIR

    @property
    def pointer(self) -> Path:
        return self.dir / POINTER

    def read_pointer(self) -> Promotion | None:
        """The champion as the pointer records it, None before the first promotion; its copy may
        be gone (a caller that must refuse in its own words checks ``draft_dir``)."""
        if not self.pointer.exists():
            return None
        return Promotion.from_dict(json.loads(self.pointer.read_text()))

    def champion(self) -> Promotion | None:
        """The current champion, or None before the first promotion; a pointer to a copy that is
        gone raises."""
        promotion = self.read_pointer()
        if promotion is None:
            return None
        if not Path(promotion.draft_dir).exists():
            raise FileNotFoundError(
                f"{self.pointer} points at {promotion.draft_dir}, which is gone: restore it or remove the pointer "
                "to start without a champion"
            )
        return promotion

    def history(self) -> list[Promotion]:
        path = self.dir / HISTORY
        if not path.exists():
            return []
        return [
            Promotion.from_dict(json.loads(line))
            for line in path.read_text().splitlines()
            if line.strip()
        ]

    def _copy(self, export_dir: Path, did: str) -> Path:
        dest = self.dir / "drafts" / did
        if dest.exists():
            return dest
        tmp = dest.with_name(f"{did}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for item in Path(export_dir).iterdir():
            if item.is_file():
                shutil.copy2(item, tmp / item.name)
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
        return dest

    def _append_history(self, promotion: Promotion) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / HISTORY, "a") as fh:
            fh.write(json.dumps(asdict(promotion), sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def promote(
        self,
        export_dir: Path,
        *,
        report: Path | str,
        metrics: dict[str, Any] | None = None,
        speculative: dict[str, Any] | None = None,
    ) -> Promotion:
        """Make ``export_dir`` the champion: copy it in, record it in the history, then swap the
        pointer. Once the run is stopping (``eagle3.runtime.stop``) nothing is recorded: ``Stopped``
        is raised before the history."""
        did = draft_id(export_dir)
        dest = self._copy(Path(export_dir), did)
        promotion = Promotion(
            draft_id=did,
            draft_dir=str(dest),
            source_dir=str(Path(export_dir).resolve()),
            report=str(report),
            metrics=dict(metrics or {}),
            speculative=dict(speculative or {}),
        )
        raise_if_stopped(f"the promotion of draft {did}")
        self._append_history(promotion)
        atomic_write_json(self.pointer, asdict(promotion))
        logger.info("promoted draft %s (%s) as champion", did, export_dir)
        return promotion
