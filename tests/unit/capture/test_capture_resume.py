"""Capture resumes per shard and per batch: kill -9, torn files and truncated shards are redone,
never trusted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from eagle3.capture.hf import HFBackend
from eagle3.capture.schema import CAPTURE_QUARANTINE_SCHEMA, FEATURE_SCHEMA
from eagle3.capture.shard import capture_shard, output_paths, read_regen_shard
from eagle3.data.parquet import shard_is_valid, shard_metadata


class CountingBackend:
    """The real hf backend, counting the samples it forwards and optionally poisoning some with
    NaN."""

    def __init__(
        self, inner: HFBackend, poison: set[int] | None = None, value: float = float("nan")
    ) -> None:
        self.inner, self.hidden_size, self.poison, self.seen = (
            inner,
            inner.hidden_size,
            poison or set(),
            0,
        )
        self.value = value

    def forward(self, batch_ids: list[list[int]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.seen += len(batch_ids)
        for ids, (aux, last) in zip(batch_ids, self.inner.forward(batch_ids), strict=True):
            if len(ids) in self.poison:
                aux = aux.clone()
                aux[-1, -1] = self.value
            yield aux, last


def _ids(path) -> list[str]:
    return pq.read_table(path, columns=["sample_id"]).column(0).to_pylist()


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from eagle3.capture.shard import capture_shard
    from eagle3.config.pipeline import load_yaml

    def kill_after_two(done, total, tokens, calls=[0]):
        calls[0] += 1
        if calls[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)

    config = load_yaml(Path(sys.argv[1]))
    capture_shard(config, Path(sys.argv[2]), Path(sys.argv[3]), progress=kill_after_two)
    """
)


@pytest.mark.slow
def test_kill_9_mid_shard_then_resume_keeps_each_sample_once(
    make_config, regen_shard, hf_backend, tmp_path
):
    config = make_config("capture.batch_tokens=300", "capture.aux_layers=[2,4,5]")
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(config.to_yaml())
    out_dir = tmp_path / "features" / "fp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(cfg_path), str(regen_shard), str(out_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    shard, _, parts = output_paths(out_dir, 3)
    assert not shard.exists()
    done_parts = sorted(parts.glob("shard-*.part-*.parquet"))
    assert len(done_parts) == 2
    survived = sum(len(_ids(p)) for p in done_parts)
    # a torn write from the killed batch and a half-written part must be redone, not trusted
    (parts / "shard-00003.part-00002.parquet.tmp").write_bytes(b"PAR1 torn")
    torn = parts / "shard-00003.part-00009.parquet"
    torn.write_bytes(done_parts[0].read_bytes()[:-50])

    backend = CountingBackend(hf_backend)
    result = capture_shard(config, regen_shard, out_dir, backend=backend)
    expected = [s.sample_id for s in read_regen_shard(regen_shard)]
    got = _ids(result["path"])
    assert sorted(got) == sorted(expected) and len(got) == len(set(got))
    # only what no finished part held was forwarded again
    assert backend.seen == len(expected) - survived
    assert shard_is_valid(shard, schema=FEATURE_SCHEMA, rows=len(expected))
    assert not parts.exists()


def test_finished_shard_is_skipped_without_forwarding(
    make_config, regen_shard, hf_backend, tmp_path
):
    config = make_config("capture.aux_layers=[2,4,5]")
    out_dir = tmp_path / "features" / "fp"
    capture_shard(config, regen_shard, out_dir, backend=hf_backend)
    backend = CountingBackend(hf_backend)
    again = capture_shard(config, regen_shard, out_dir, backend=backend)
    assert again["skipped"] is True and backend.seen == 0 and again["rows"] == 12


def test_cut_bytes_off_a_shard_makes_the_next_run_rebuild_it(
    make_config, regen_shard, hf_backend, tmp_path
):
    config = make_config("capture.aux_layers=[2,4,5]")
    out_dir = tmp_path / "features" / "fp"
    first = capture_shard(config, regen_shard, out_dir, backend=hf_backend)
    path = Path(first["path"])
    path.write_bytes(path.read_bytes()[:-1000])
    backend = CountingBackend(hf_backend)
    second = capture_shard(config, regen_shard, out_dir, backend=backend)
    assert second["skipped"] is False and backend.seen == 12
    assert shard_is_valid(path, schema=FEATURE_SCHEMA, rows=12)
    assert sorted(_ids(path)) == sorted(s.sample_id for s in read_regen_shard(regen_shard))


def test_shard_of_another_stage_fingerprint_is_rebuilt(
    make_config, regen_shard, hf_backend, tmp_path
):
    config = make_config("capture.aux_layers=[2,4,5]")
    capture_shard(config, regen_shard, tmp_path / "features" / "fp-a", backend=hf_backend)
    (tmp_path / "features" / "fp-a").rename(tmp_path / "features" / "fp-b")
    backend = CountingBackend(hf_backend)
    result = capture_shard(config, regen_shard, tmp_path / "features" / "fp-b", backend=backend)
    assert backend.seen == 12 and shard_metadata(result["path"])["features_fingerprint"] == "fp-b"


def test_too_long_rows_are_quarantined_with_a_reason(
    make_config, regen_shard, hf_backend, tmp_path
):
    lengths = sorted(len(s.input_ids) for s in read_regen_shard(regen_shard))
    limit = lengths[len(lengths) // 2]
    config = make_config("capture.aux_layers=[2,4,5]", f"capture.max_seq_len={limit}")
    result = capture_shard(config, regen_shard, tmp_path / "features" / "fp", backend=hf_backend)
    _, quarantine, _ = output_paths(tmp_path / "features" / "fp", 3)
    q = pq.read_table(quarantine).cast(CAPTURE_QUARANTINE_SCHEMA).to_pylist()
    too_long = sum(n > limit for n in lengths)
    assert result["quarantined"] == too_long == len(q) > 0
    assert {r["reason"] for r in q} == {"too_long"} and all(r["seq_len"] > limit for r in q)
    assert result["rows"] + too_long == 12


def test_truncate_policy_cuts_rows_and_records_it(make_config, regen_shard, hf_backend, tmp_path):
    config = make_config(
        "capture.aux_layers=[2,4,5]", "capture.max_seq_len=40", "capture.truncation=truncate"
    )
    result = capture_shard(config, regen_shard, tmp_path / "features" / "fp", backend=hf_backend)
    table = pq.read_table(result["path"])
    assert result["rows"] == 12 and max(table.column("seq_len").to_pylist()) == 40
    assert all(
        len(m) == n
        for m, n in zip(
            table.column("loss_mask").to_pylist(), table.column("seq_len").to_pylist(), strict=True
        )
    )
    assert shard_metadata(result["path"])["truncation"] == "truncate"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_states_are_quarantined_not_written(
    make_config, regen_shard, hf_backend, tmp_path, value
):
    config = make_config("capture.aux_layers=[2,4,5]")
    samples = read_regen_shard(regen_shard)
    bad_len = len(samples[0].input_ids)
    bad = {s.sample_id for s in samples if len(s.input_ids) == bad_len}
    result = capture_shard(
        config,
        regen_shard,
        tmp_path / "features" / "fp",
        backend=CountingBackend(hf_backend, poison={bad_len}, value=value),
    )
    _, quarantine, _ = output_paths(tmp_path / "features" / "fp", 3)
    q = pq.read_table(quarantine).to_pylist()
    assert {r["sample_id"] for r in q} == bad and {r["reason"] for r in q} == {"non_finite"}
    assert not bad & set(_ids(result["path"]))


class _Killed(BaseException):
    """Stands for a kill -9 at one line: nothing after it runs, nothing catches it."""


def test_kill_between_merge_rename_and_parts_delete_recovers_on_rerun(
    make_config, regen_shard, hf_backend, tmp_path, monkeypatch
):
    from eagle3.capture import writer
    from eagle3.capture.manifest import finalize_features

    config = make_config("capture.aux_layers=[2,4,5]")
    out_dir = tmp_path / "features" / "fp"

    def killed(path, *args, **kwargs):
        raise _Killed

    # the shard is renamed, its parts never removed
    monkeypatch.setattr(writer, "remove_in_background", killed)
    with pytest.raises(_Killed):
        capture_shard(config, regen_shard, out_dir, backend=hf_backend)
    shard, _, parts = output_paths(out_dir, 3)
    assert shard.exists() and parts.exists()  # the crash window: a finished shard plus its parts
    monkeypatch.undo()
    backend = CountingBackend(hf_backend)
    again = capture_shard(config, regen_shard, out_dir, backend=backend)
    assert again["skipped"] is True and backend.seen == 0 and not parts.exists()
    assert finalize_features(config, out_dir, [3]).exists()


def test_finishing_a_shard_does_not_wait_for_its_parts_to_be_deleted(
    make_config, regen_shard, hf_backend, tmp_path, held_rmtree
):
    """A Kimi shard's parts are ~34 GB, slow to delete on NFS or a discard mount: the capture
    returns with the parts out of the way (renamed) while another thread deletes them, so the next
    shard's forward need not wait."""
    import threading

    config = make_config("capture.batch_tokens=300", "capture.aux_layers=[2,4,5]")
    out_dir = tmp_path / "features" / "fp"
    # returns while the deletion is held
    capture_shard(config, regen_shard, out_dir, backend=hf_backend)
    shard, _, parts = output_paths(out_dir, 3)
    assert shard_is_valid(shard, schema=FEATURE_SCHEMA, rows=12) and not parts.exists()
    held_rmtree.release.set()
    (deleter,) = held_rmtree.deleters
    deleter.join(timeout=60)
    assert deleter is not threading.current_thread() and not list(out_dir.glob(".removed-*"))


@pytest.mark.parametrize("thread", ["parts", "shard"])
def test_a_failing_writer_stops_the_capture_and_keeps_the_parts_it_wrote(
    make_config, regen_shard, hf_backend, tmp_path, monkeypatch, thread
):
    """The disk fills on the second part file (the parts thread) or on the second table compressed
    into the shard (the shard thread): either way the capture fails with the error, and a resume
    redoes only what no part holds."""
    from eagle3.capture import writer

    config = make_config("capture.batch_tokens=300", "capture.aux_layers=[2,4,5]")
    out_dir = tmp_path / "features" / "fp"
    owner, name = (
        (writer, "_write_part") if thread == "parts" else (writer.ShardWriter, "write_table")
    )
    real, calls = getattr(owner, name), []

    def disk_full_on_the_second_call(*args):
        calls.append(args)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(*args)

    monkeypatch.setattr(owner, name, disk_full_on_the_second_call)
    with pytest.raises(RuntimeError, match=r"capture writer of shard 3 failed.*No space left"):
        capture_shard(config, regen_shard, out_dir, backend=hf_backend)
    shard, _, parts = output_paths(out_dir, 3)
    assert not shard.exists() and not shard.with_name(shard.name + ".tmp").exists()
    kept = sorted(parts.glob("shard-*.part-*.parquet"))
    assert kept if thread == "shard" else len(kept) == 1
    survived = sum(len(_ids(part)) for part in kept)
    monkeypatch.undo()
    backend = CountingBackend(hf_backend)
    result = capture_shard(config, regen_shard, out_dir, backend=backend)
    assert backend.seen == 12 - survived  # the part written before the failure is kept, not redone
    assert sorted(_ids(result["path"])) == sorted(
        s.sample_id for s in read_regen_shard(regen_shard)
    )


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
@pytest.mark.parametrize(("device", "nice"), [("cpu", 19), ("cuda", 0)])
def test_the_writer_yields_the_cpu_to_a_forward_on_the_cpu_only(
    make_config, regen_shard, hf_backend, tmp_path, monkeypatch, device, nice
):
    """On a CPU target the writer's threads (part files, shard compression) share the cores with the
    forward: they run at the lowest priority there (and the forward's own thread keeps its
    priority); next to a GPU forward they keep the normal one. The backend is the CPU one either
    way: only the config's device is asked."""
    from eagle3.capture.writer import PartWriter, ShardWriter

    seen: dict[str, list[int]] = {"parts": [], "shard": []}
    for thread, cls, name in (
        ("parts", PartWriter, "_write"),
        ("shard", ShardWriter, "write_table"),
    ):
        method = getattr(cls, name)
        monkeypatch.setattr(
            cls,
            name,
            lambda self, arg, method=method, thread=thread: (
                seen[thread].append(os.getpriority(os.PRIO_PROCESS, 0)),
                method(self, arg),
            )[1],
        )
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    result = capture_shard(
        make_config("capture.aux_layers=[2,4,5]", f"capture.device={device}"),
        regen_shard,
        tmp_path / "features" / "fp",
        backend=hf_backend,
    )
    assert result["rows"] == 12 and seen["parts"] and seen["shard"]
    assert set(seen["parts"]) == set(seen["shard"]) == {max(nice, mine)}
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine
