"""Verify what a stage reads against the manifest its producer wrote, before the data is used.

Every finished stage directory lists its files with size and sha256 (``eagle3.runroot.Manifest``). A Parquet footer
only proves the file ends well: bytes overwritten inside a column chunk still decode, into wrong numbers (a NaN
draft from one damaged hidden-state page). So a reader verifies the files it is about to use against the manifest
first, and refuses, naming each damaged file and the command that rebuilds it, instead of training on them.

Cost: one sequential sha256 pass over the files, on threads (``hashlib`` releases the GIL on large buffers), paid
once when a loader opens a stage directory; ``benchmarks/loader.py`` measures it against an epoch (BENCHMARKS.md).
Processes that read the same files (the ranks of one training run) split that pass instead of each paying it:
``verify_files(..., share=Share(rank, world_size, gather))`` hashes this process's part of the bytes and learns
every process's problems from ``gather``, so all of them refuse together. At Kimi-K2.5's scale (~3 TB of features,
8 ranks per node) each byte is hashed once instead of eight times; the disk reads it once, where before the ranks
of a node shared their reads only as far as the page cache (far smaller than 3 TB) kept them in step, and the
nodes of a multi-node run each read all of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from eagle3.errors import DataError
from eagle3.runroot import FileEntry, Manifest, sha256_file

logger = logging.getLogger(__name__)

HASH_THREADS = 4


@dataclass(frozen=True)
class Share:
    """This process's part of a verification split over ``world_size`` processes that read the same files:
    ``gather`` takes this process's problem lines and returns every process's (an all-gather)."""

    rank: int
    world_size: int
    gather: Callable[[list[str]], list[str]]


ALONE = Share(rank=0, world_size=1, gather=lambda problems: problems)


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


def _listed(paths: Sequence[Path]) -> list[tuple[Path, FileEntry]]:
    """(directory, manifest entry) of each of ``paths`` its directory's manifest lists (files in a directory without
    a manifest, e.g. a stage still running, are not checked)."""
    by_dir: dict[Path, set[str]] = {}
    for path in paths:
        by_dir.setdefault(Path(path).parent, set()).add(Path(path).name)
    listed = []
    for directory, names in by_dir.items():
        manifest = Manifest.read(directory)
        listed += [(directory, e) for e in (manifest.files if manifest else []) if e.path in names]
    return listed


def share_of(listed: list[tuple[Path, FileEntry]], rank: int, world_size: int) -> list[tuple[Path, FileEntry]]:
    """Rank ``rank``'s files of a split of ``listed`` over ``world_size`` processes: largest first, each to the
    process with the fewest bytes so far (ties to the lowest rank), so the processes hash about the same bytes. A pure
    function of the manifests' entries: every process computes the same split."""
    loads, mine = [0] * world_size, []
    for directory, entry in sorted(listed, key=lambda item: (-item[1].bytes, str(item[0]), item[1].path)):
        owner = min(range(world_size), key=lambda r: (loads[r], r))
        loads[owner] += entry.bytes
        if owner == rank:
            mine.append((directory, entry))
    return mine


def damaged_files(paths: Sequence[Path], *, share: Share = ALONE) -> list[str]:
    """One problem line per file of ``paths`` (this process's ``share`` of them) that is missing, resized or whose
    sha256 differs from its directory's manifest; empty when all hold."""
    entries = share_of(_listed(paths), share.rank, share.world_size)
    with ThreadPoolExecutor(min(HASH_THREADS, max(len(entries), 1))) as pool:
        return [p for p in pool.map(lambda item: _problem(*item), entries) if p is not None]


def verify_files(paths: Sequence[Path], *, rebuild: str, share: Share = ALONE) -> None:
    """Raise ``DataError`` when any of ``paths`` differs from the manifest of its directory, on every process of
    ``share`` (each hashes its part: ``damaged_files``). ``rebuild`` is the command that remakes them."""
    problems = share.gather(damaged_files(paths, share=share))
    if problems:
        raise DataError(f"{len(problems)} damaged file(s), not used: {'; '.join(problems)}. Fix: delete the damaged "
                        f"file(s) and the directory's manifest.json, then run `{rebuild}` to rebuild them")
    logger.debug("verified %d file(s) against their manifests (share %d of %d)", len(paths), share.rank,
                 share.world_size)
