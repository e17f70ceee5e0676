"""The run root: fingerprinted stage directories, atomic writes and manifests
(docs/DESIGN.md, "The run root and the stage contract").

Every stage writes into ``<root>/<stage>/<fingerprint>/`` and writes ``manifest.json`` last; a stage
is done only when its manifest exists. Files are written as ``*.tmp`` and renamed into place, so a
kill leaves either the old state or the new one, never half a file under a final name.

Workers on several machines share one run root, so it must be one shared filesystem (NFS or another
shared POSIX filesystem) mounted at the same path everywhere. ``.eagle3-root.json`` gives the root
an id at first use; a worker that expects that id and finds another root (a local, empty directory
where the mount should be) stops at flow start (``check_run_root``) instead of regenerating days of
shards into a disk nobody else reads. Prefect's task results live under the root too
(``.prefect-results/``), so a cached unit recorded on one machine is a hit on all.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
ROOT_MARKER = ".eagle3-root.json"  # {"id", "created_at", "created_on"}: the run root's identity
# Prefect result storage (persisted task results), shared like the stage dirs
RESULTS_DIR = ".prefect-results"
SHARED_STORAGE_RULE = (
    "every worker must see the run root as one shared filesystem mounted at the same path (NFS or another shared "
    "POSIX filesystem; README 'Shared storage')"
)


class SharedStorageError(RuntimeError):
    """This machine cannot use the run root the run expects (missing, another root, or not
    writable)."""


def fingerprint(*parts: Any, length: int = 16) -> str:
    """Stable short hash of JSON-serialisable parts (dict keys sorted)."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def sha256_file(path: Path, *, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def footer_sha256(path: Path) -> str:
    """The sha256 of ``path``'s Parquet footer: its last ``8 + footer length`` bytes (metadata,
    length, magic). The bytes that page checksums do not cover, and that say where every page is:
    with this hash and a checksummed read, every byte a read uses is checked
    (``tests/unit/data/test_parquet_writer.py`` flips each byte)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(size - 8, 0))
        length = int.from_bytes(fh.read(4), "little")
        fh.seek(max(size - 8 - length, 0))  # a damaged length hashes other bytes: no match
        return hashlib.sha256(fh.read()).hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a ``*.tmp`` sibling to write; on success it is fsynced and renamed onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


# a directory being deleted in the background (``remove_in_background``)
REMOVED_PREFIX = ".removed-"
_REMOVER = "eagle3-remove-"  # the name of the thread deleting it


def remove_in_background(path: Path) -> threading.Thread:
    """Rename the directory ``path`` aside (it is gone for every reader at once) and delete it on a
    thread of its own, which is returned. Deleting tens of GB is not instant on the filesystems a
    run root lives on: NFS and Lustre unlink on the server, and ext4 or XFS mounted with ``discard``
    trims what it frees (~1 s/GB on this project's build VM), so a caller that waited would hold a
    GPU idle. The interpreter waits for the thread at exit; after a kill, ``sweep_removed`` finishes
    the job."""
    path = Path(path)
    aside = path.with_name(f"{REMOVED_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}")
    os.replace(path, aside)
    thread = threading.Thread(
        target=shutil.rmtree,
        args=(aside,),
        kwargs={"ignore_errors": True},
        name=f"{_REMOVER}{path.name}",
    )
    thread.start()
    return thread


def wait_removals() -> None:
    """Wait for this process's ``remove_in_background`` deletions: before deleting the directory
    they are in (a benchmark's round) or measuring the disk again."""
    for thread in threading.enumerate():
        if thread.name.startswith(_REMOVER):
            thread.join()


def sweep_removed(parent: Path) -> None:
    """Delete what ``remove_in_background`` renamed aside in ``parent`` but a killed process left
    there."""
    for aside in Path(parent).glob(f"{REMOVED_PREFIX}*"):
        shutil.rmtree(aside, ignore_errors=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` atomically; rewriting identical content leaves the file and its mtime alone,
    so a re-run that plans the same work (``plan.json``, ``failed_shards.json``) changes nothing in
    the run root."""
    path = Path(path)
    if path.is_file() and path.read_text() == text:
        return
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("eagle3-pipeline", "torch", "transformers", "pyarrow"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


@dataclass
class FileEntry:
    """One file of a stage directory. ``footer_sha256``: set for a Parquet shard whose writer gave
    every page a checksum (``eagle3.data.parquet``): a reader that checks the pages as it reads them
    checks the footer by this instead of hashing the whole file first (``eagle3.rundir.integrity``);
    None for any other file."""

    path: str
    rows: int
    bytes: int
    sha256: str
    footer_sha256: str | None = None

    @classmethod
    def of(
        cls,
        path: Path,
        *,
        rows: int,
        base: Path,
        sha256: str | None = None,
        footer_sha256: str | None = None,
    ) -> FileEntry:
        """``path``'s entry; ``sha256``: its checksum when already known (its writer hashed it as it
        wrote it), else the file is read and hashed."""
        return cls(
            str(path.relative_to(base)),
            rows,
            path.stat().st_size,
            sha256 or sha256_file(path),
            footer_sha256,
        )


@dataclass
class Manifest:
    """What a finished stage directory holds; written last."""

    stage: str
    fingerprint: str
    files: list[FileEntry] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=versions)
    created_at: float = field(default_factory=time.time)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    def write(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST
        atomic_write_json(path, asdict(self) | {"rows": self.rows})
        return path

    @classmethod
    def read(cls, directory: Path) -> Manifest | None:
        """The manifest of a finished stage directory, or None when the stage is not done."""
        path = Path(directory) / MANIFEST
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data.pop("rows", None)
        data["files"] = [FileEntry(**f) for f in data.get("files", [])]
        return cls(**data)

    def verify(self, directory: Path) -> list[str]:
        """Problems with the listed files (missing, size or checksum changed); empty when all
        hold."""
        problems = []
        for entry in self.files:
            path = Path(directory) / entry.path
            if not path.exists():
                problems.append(f"{entry.path}: missing")
            elif path.stat().st_size != entry.bytes or sha256_file(path) != entry.sha256:
                problems.append(f"{entry.path}: changed since the manifest was written")
        return problems


def claim_run_root(root: Path) -> str:
    """The run root's id, giving the root one (and creating it) at first use."""
    root = Path(root)
    marker = root / ROOT_MARKER
    if not marker.exists():
        root.mkdir(parents=True, exist_ok=True)
        info = {
            "id": uuid.uuid4().hex,
            "created_at": time.time(),
            "created_on": socket.gethostname(),
        }
        # two first users racing: one id wins the rename, both read it back
        with atomic_path(marker) as tmp:
            tmp.write_text(json.dumps(info, indent=2) + "\n")
    return json.loads(marker.read_text())["id"]


def check_run_root(root: Path, expected_id: str | None = None) -> str:
    """Fail fast unless this machine can read and write ``root`` and, when ``expected_id`` is given,
    the root is the one with that id; returns the root's id (claimed here when the run expects
    none)."""
    root = Path(root)
    host = socket.gethostname()
    if expected_id is not None:
        marker = root / ROOT_MARKER
        if not marker.exists():
            raise SharedStorageError(
                f"run root {root} on {host}: no {ROOT_MARKER} (expected root id {expected_id}), so this machine "
                f"does not see the run's shared run root: {SHARED_STORAGE_RULE}"
            )
        found = json.loads(marker.read_text()).get("id")
        if found != expected_id:
            raise SharedStorageError(
                f"run root {root} on {host} is root id {found}, the run expects {expected_id}: {SHARED_STORAGE_RULE}"
            )
    try:
        root_id = claim_run_root(root)
        probe = root / f".probe-{host}-{os.getpid()}"
        atomic_write_text(probe, host)
        readable = probe.read_text() == host
        probe.unlink()
    except OSError as err:
        raise SharedStorageError(
            f"run root {root} on {host} is not writable ({err}): {SHARED_STORAGE_RULE}"
        ) from err
    if not readable:
        raise SharedStorageError(
            f"run root {root} on {host} returned other bytes than written: {SHARED_STORAGE_RULE}"
        )
    return root_id
