"""Verify what a stage reads against the manifest its producer wrote, before the data is used.

Every finished stage directory lists its files with size and sha256 (``eagle3.runroot.Manifest``). A Parquet footer
only proves the file ends well: bytes overwritten inside a column chunk still decode, into wrong numbers (a NaN
draft from one damaged hidden-state page). So a reader verifies the files it is about to use against the manifest
first, and refuses, naming each damaged file and the command that rebuilds it, instead of training on them.

Cost: one sequential sha256 pass over the files, on threads (``hashlib`` releases the GIL on large buffers), paid
once when a loader opens a stage directory; ``benchmarks/loader.py`` measures it against an epoch (BENCHMARKS.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eagle3.errors import DataError
from eagle3.runroot import FileEntry, Manifest, sha256_file

logger = logging.getLogger(__name__)

HASH_THREADS = 4


def _problem(directory: Path, entry: FileEntry) -> str | None:
    path = directory / entry.path
    if not path.exists():
        return f"{path}: missing"
    size = path.stat().st_size
    if size != entry.bytes:
        return f"{path}: {size} bytes, the manifest says {entry.bytes} (truncated or replaced)"
    if sha256_file(path) != entry.sha256:
        return f"{path}: sha256 differs from the manifest (the bytes were damaged after it was written)"
    return None


def damaged_files(directory: Path | str, names: Sequence[str] | None = None) -> list[str]:
    """One problem line per file of ``directory``'s manifest (only ``names``, relative paths, when given) that is
    missing, resized or whose sha256 differs; empty when all hold or when there is no manifest to check against."""
    directory = Path(directory)
    manifest = Manifest.read(directory)
    if manifest is None:
        return []
    wanted = None if names is None else set(names)
    entries = [e for e in manifest.files if wanted is None or e.path in wanted]
    with ThreadPoolExecutor(min(HASH_THREADS, max(len(entries), 1))) as pool:
        return [p for p in pool.map(lambda e: _problem(directory, e), entries) if p is not None]


def verify_files(paths: Sequence[Path], *, rebuild: str) -> None:
    """Raise ``DataError`` when any of ``paths`` differs from the manifest of its directory (files in a directory
    without a manifest, e.g. a stage still running, are not checked). ``rebuild`` is the command that remakes them."""
    by_dir: dict[Path, list[str]] = {}
    for path in paths:
        by_dir.setdefault(Path(path).parent, []).append(Path(path).name)
    problems = [p for directory, names in by_dir.items() for p in damaged_files(directory, names)]
    if problems:
        raise DataError(f"{len(problems)} damaged file(s), not used: {'; '.join(problems)}. Fix: delete the damaged "
                        f"file(s) and the directory's manifest.json, then run `{rebuild}` to rebuild them")
    logger.debug("verified %d file(s) against their manifests", len(paths))
