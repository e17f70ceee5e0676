from __future__ import annotations

from pathlib import Path

import pytest

from eagle3.rundir.layout import stage_dir
from eagle3.rundir.runroot import (
    ROOT_MARKER,
    FileEntry,
    Manifest,
    SharedStorageError,
    atomic_path,
    atomic_write_json,
    check_run_root,
    claim_run_root,
    fingerprint,
    remove_in_background,
    sweep_removed,
    wait_removals,
)


def test_fingerprint_ignores_key_order_and_sees_values():
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


def test_stage_is_done_only_when_its_manifest_exists(tmp_path: Path):
    d = stage_dir(tmp_path, "normalize", fingerprint("x"))
    assert Manifest.read(d) is None
    (d / "shard-00000.parquet").parent.mkdir(parents=True)
    (d / "shard-00000.parquet").write_bytes(b"abc")
    m = Manifest(
        "prompts",
        "fp",
        files=[FileEntry.of(d / "shard-00000.parquet", rows=3, base=d)],
        stats={"in": 3},
    )
    m.write(d)
    back = Manifest.read(d)
    assert back is not None and back.rows == 3 and back.stats == {"in": 3}
    assert back.verify(d) == []
    (d / "shard-00000.parquet").write_bytes(b"abd")
    assert back.verify(d) == ["shard-00000.parquet: changed since the manifest was written"]


def test_atomic_path_keeps_the_old_file_when_writing_fails(tmp_path: Path):
    target = tmp_path / "a.json"
    atomic_write_json(target, {"v": 1})
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("boom")
    assert target.read_text().strip().startswith("{")
    assert not list(tmp_path.glob("*.tmp"))


def test_run_root_gets_one_id_at_first_use_and_keeps_it(tmp_path: Path):
    root = tmp_path / "new-root"
    first = check_run_root(root)  # no expected id: a local run claims the root
    assert (root / ROOT_MARKER).is_file() and claim_run_root(root) == first
    assert check_run_root(root, first) == first
    assert [p.name for p in root.iterdir()] == [ROOT_MARKER], "the write probe was left behind"


def test_worker_without_the_shared_root_is_refused_with_the_requirement(tmp_path: Path):
    shared_id = claim_run_root(tmp_path / "shared")
    unmounted = tmp_path / "where-the-mount-should-be"
    with pytest.raises(
        SharedStorageError, match=f"expected root id {shared_id}.*shared filesystem"
    ):
        check_run_root(unmounted, shared_id)
    assert not unmounted.exists(), "a refused worker must not create a local run root"
    other = tmp_path / "another-root"
    other_id = claim_run_root(other)
    with pytest.raises(
        SharedStorageError, match=f"is root id {other_id}, the run expects {shared_id}"
    ):
        check_run_root(other, shared_id)


def test_a_directory_removed_in_background_is_gone_at_once_and_deleted_off_the_callers_thread(
    tmp_path, held_rmtree
):
    """Deleting a shard's tens of GB of parts can take a minute on NFS or a discard mount: the
    caller gets the directory out of every reader's way by a rename and goes on while another thread
    deletes it."""
    import threading

    parts = tmp_path / "parts-00003"
    parts.mkdir()
    (parts / "shard-00003.part-00000.parquet").write_bytes(b"x" * 1000)
    thread = remove_in_background(parts)
    assert not parts.exists() and [
        p.name.startswith(".removed-parts-00003-") for p in tmp_path.iterdir()
    ] == [True]
    held_rmtree.release.set()
    wait_removals()
    assert (
        held_rmtree.deleters == [thread]
        and thread is not threading.current_thread()
        and not thread.is_alive()
    )
    assert list(tmp_path.iterdir()) == []


def test_sweep_deletes_what_a_killed_process_left_half_removed_and_nothing_else(tmp_path: Path):
    (tmp_path / ".removed-parts-00001-0a1b2c3d").mkdir()
    (tmp_path / ".removed-parts-00001-0a1b2c3d" / "part.parquet").write_bytes(b"x")
    (tmp_path / "parts-00002").mkdir()
    (tmp_path / "shard-00001.parquet").write_bytes(b"x")
    sweep_removed(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts-00002", "shard-00001.parquet"]
