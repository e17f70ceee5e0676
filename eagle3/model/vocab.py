"""The draft vocabulary as a type (docs/DESIGN.md, "The draft vocab"): which target ids the draft's
``lm_head`` can emit.

A ``DraftVocab`` is the pair of maps of the export format (``d2t`` int64 offsets, ``t2d`` bool mask;
the rules live in ``eagle3.model.export_format``) plus the loss-masked ``counts`` they were selected
from. It is saved as one safetensors file, ``vocab.safetensors``, that the trainer and export read;
loading checks the maps against the format's rules, so a broken file fails where it is read, not at
serving time. Building one from feature shards is the vocab stage's job (``eagle3.train.vocab``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eagle3.model.export_format import target_ids, vocab_problems
from eagle3.rundir.layout import VOCAB_FILE
from eagle3.rundir.runroot import atomic_path


@dataclass(frozen=True)
class DraftVocab:
    d2t: torch.Tensor  # int64 [draft_vocab]: target_id - draft_id
    t2d: torch.Tensor  # bool [target_vocab]: target id is in the draft vocab
    counts: torch.Tensor  # int64 [target_vocab]: loss-masked occurrences

    @property
    def draft_vocab_size(self) -> int:
        return int(self.d2t.numel())

    @property
    def target_vocab_size(self) -> int:
        return int(self.t2d.numel())

    @property
    def target_ids(self) -> torch.Tensor:
        """Target id of each draft id (ascending)."""
        return target_ids(self.d2t)


def save_vocab(vocab: DraftVocab, path: Path) -> Path:
    """Write ``d2t``, ``t2d``, ``counts`` to ``path`` (safetensors, atomically)."""
    meta = {
        "draft_vocab_size": str(vocab.draft_vocab_size),
        "target_vocab_size": str(vocab.target_vocab_size),
    }
    tensors = {
        "d2t": vocab.d2t.contiguous(),
        "t2d": vocab.t2d.contiguous(),
        "counts": vocab.counts.contiguous(),
    }
    with atomic_path(Path(path)) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return Path(path)


def load_vocab(path: Path) -> DraftVocab:
    """Load a vocab file (or a vocab stage directory) and check that ``d2t`` and ``t2d`` follow the
    format's rules."""
    path = Path(path)
    path = path / VOCAB_FILE if path.is_dir() else path
    tensors = load_file(str(path))
    missing = {"d2t", "t2d", "counts"} - set(tensors)
    if missing:
        raise ValueError(f"{path}: missing tensors {sorted(missing)}; rebuild with `eagle3 vocab`")
    vocab = DraftVocab(d2t=tensors["d2t"], t2d=tensors["t2d"], counts=tensors["counts"])
    problems = vocab_problems(vocab.d2t, vocab.t2d, vocab.target_vocab_size)
    if problems:
        raise ValueError(f"{path}: {'; '.join(problems)}; rebuild with `eagle3 vocab`")
    return vocab
