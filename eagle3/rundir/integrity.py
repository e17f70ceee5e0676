"""Verify what a stage reads against the manifest its producer wrote, before the data is used.

Every finished stage directory lists its files with size and sha256
(``eagle3.rundir.runroot.Manifest``). A Parquet footer only proves the file ends well: bytes
overwritten inside a column chunk still decode, into wrong numbers (a NaN draft from one damaged
hidden-state page). So a reader verifies the files it is about to use against the manifest first,
and refuses, naming each damaged file and the command that rebuilds it, instead of training on them.

Two ways, by what the reader reads:
* **whole files, first** (the default): one sequential sha256 pass over the files, on threads
  (``hashlib`` releases the GIL on large buffers), before the reader uses any of them.
* **each page, as it is read** (``pages_checked=True``), for readers of files far larger than a pass
  should make them wait for: a night of Kimi-K2.5 features is ~3 TB, and a first pass reads all of
  it from disk before training starts (at every resume too) on top of the epoch's own read. Every
  page a ``ShardWriter`` writes carries a CRC32 and the manifest records the shard's footer sha256
  (``FileEntry.footer_sha256``); here only the footers are hashed, and the reader reads with Arrow's
  page checksum verification (``eagle3.train.feature_reader``) and refuses a row group whose page
  fails it (``checked_read``). A file listed without a footer hash (written before pages had
  checksums) gets the whole-file pass. ``benchmarks/loader.py`` measures both ways against an epoch
  (BENCHMARKS.md).

Processes that read the same files (the ranks of one training run) split the checks instead of each
paying them: ``verify_files(..., share=Share(rank, world_size, gather))`` checks this process's part
of the bytes and learns every process's problems from ``gather``, so all of them refuse together.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from eagle3.errors import DataError
from eagle3.rundir.runroot import FileEntry, Manifest, footer_sha256, sha256_file

logger = logging.getLogger(__name__)

HASH_THREADS = 4


@dataclass(frozen=True)
class Share:
    """This process's part of a verification split over ``world_size`` processes that read the same
    files: ``gather`` takes this process's problem lines and returns every process's (an
    all-gather)."""

    rank: int
    world_size: int
    gather: Callable[[list[str]], list[str]]


ALONE = Share(rank=0, world_size=1, gather=lambda problems: problems)


def _problem(directory: Path, entry: FileEntry, pages_checked: bool) -> str | None:
    path = directory / entry.path
    if not path.exists():
        return f"{path}: missing"
    size = path.stat().st_size
    if size != entry.bytes:
        return f"{path}: {size} bytes, the manifest says {entry.bytes} (truncated or replaced)"
    if pages_checked and entry.footer_sha256 is not None:
        if footer_sha256(path) != entry.footer_sha256:
            return f"{path}: the footer's sha256 differs from the manifest (damaged after it was written)"
    elif sha256_file(path) != entry.sha256:
        return f"{path}: sha256 differs from the manifest (the bytes were damaged after it was written)"
    return None


def _refusal(problems: Sequence[str], rebuild: str) -> DataError:
    return DataError(
        f"{len(problems)} damaged file(s), not used: {'; '.join(problems)}. Fix: delete the damaged "
        f"file(s), then run `{rebuild}` to rebuild them"
    )


@contextmanager
def checked_read(path: Path, *, rebuild: str, row_group: int | None = None) -> Iterator[None]:
    """Around a read of ``path`` (of ``row_group``, or None: of the whole file) with page checksum
    verification: a page that fails its checksum, or does not decode, raises the refusal
    (``DataError``) instead of Arrow's error."""
    try:
        yield
    except (OSError, pa.ArrowInvalid) as exc:
        where = path if row_group is None else f"{path} row group {row_group}"
        raise _refusal([f"{where}: does not read back ({_one_line(exc)})"], rebuild) from exc


def _one_line(exc: BaseException) -> str:
    """Arrow's error as one printable line: a damaged page header's message spans lines and quotes
    the raw byte it could not parse ("don't know what type: \\x0f"), which would cut the refusal's
    one ``error:`` line."""
    text = " ".join(str(exc).split())
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def _listed(paths: Sequence[Path]) -> list[tuple[Path, FileEntry]]:
    """(directory, manifest entry) of each of ``paths`` its directory's manifest lists (files in a
    directory without a manifest, e.g. a stage still running, are not checked)."""
    by_dir: dict[Path, set[str]] = {}
    for path in paths:
        by_dir.setdefault(Path(path).parent, set()).add(Path(path).name)
    listed = []
    for directory, names in by_dir.items():
        manifest = Manifest.read(directory)
        listed += [(directory, e) for e in (manifest.files if manifest else []) if e.path in names]
    return listed


def share_of(
    listed: list[tuple[Path, FileEntry]], rank: int, world_size: int
) -> list[tuple[Path, FileEntry]]:
    """Rank ``rank``'s files of a split of ``listed`` over ``world_size`` processes: largest first,
    each to the process with the fewest bytes so far (ties to the lowest rank), so the processes
    hash about the same bytes. A pure function of the manifests' entries: every process computes the
    same split."""
    loads, mine = [0] * world_size, []
    for directory, entry in sorted(
        listed, key=lambda item: (-item[1].bytes, str(item[0]), item[1].path)
    ):
        owner = min(range(world_size), key=lambda r: (loads[r], r))
        loads[owner] += entry.bytes
        if owner == rank:
            mine.append((directory, entry))
    return mine


def damaged_files(
    paths: Sequence[Path], *, share: Share = ALONE, pages_checked: bool = False
) -> list[str]:
    """One problem line per file of ``paths`` (this process's ``share`` of them) that is missing,
    resized or whose sha256 differs from its directory's manifest; empty when all hold.
    ``pages_checked``: the caller reads the files with page checksum verification, so a file whose
    entry has a ``footer_sha256`` is hashed only there."""
    entries = share_of(_listed(paths), share.rank, share.world_size)
    with ThreadPoolExecutor(min(HASH_THREADS, max(len(entries), 1))) as pool:
        return [
            p
            for p in pool.map(lambda item: _problem(*item, pages_checked), entries)
            if p is not None
        ]


def verify_files(
    paths: Sequence[Path], *, rebuild: str, share: Share = ALONE, pages_checked: bool = False
) -> None:
    """Raise ``DataError`` when any of ``paths`` differs from the manifest of its directory, on
    every process of ``share`` (each hashes its part: ``damaged_files``). ``rebuild`` is the command
    that remakes them once they are deleted (a stage that redoes only its missing units needs no
    more; one that redoes all or nothing, its manifest removed too)."""
    problems = share.gather(damaged_files(paths, share=share, pages_checked=pages_checked))
    if problems:
        raise _refusal(problems, rebuild)
    logger.debug(
        "verified %d file(s) against their manifests (share %d of %d)",
        len(paths),
        share.rank,
        share.world_size,
    )
