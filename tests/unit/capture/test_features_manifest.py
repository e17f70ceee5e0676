"""The features manifest lists each shard with the hashes its writer computed as it wrote it,
whichever run or process finished the shard: finalizing reads no shard back (a night of Kimi-K2.5
features is ~3 TB, ~40 min of sha256 on one core), a shard damaged since it was written is refused
rather than re-hashed into the manifest, and following the loader's refusal rebuilds the damaged
shard alone."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow.parquet as pq
import pytest
import torch

import eagle3.rundir.integrity as integrity
import eagle3.rundir.runroot as runroot
from eagle3.capture.manifest import finalize_features
from eagle3.capture.schema import FEATURE_SCHEMA
from eagle3.capture.shard import capture_shard, output_paths, shard_index_of
from eagle3.capture.stage import CaptureStage
from eagle3.errors import DataError
from eagle3.rundir.integrity import verify_files
from eagle3.rundir.layout import hashes_file_name
from eagle3.rundir.runroot import FileEntry, Manifest, footer_sha256
from eagle3.stage import UnitsFailed, run_stage
from eagle3.train.data import FeatureDataset

# CRC-32 (reflected, as Parquet's page checksum) of a message XORed with its generator polynomial,
# shifted anywhere in the message, is the message's own CRC: ``1 | 0xEDB88320 << 1`` is that 33-bit
# polynomial in the stream's bit order (bit i of the message as a little-endian integer).
CRC32_CODEWORD = 1 | 0xEDB88320 << 1


class Recaptured:
    """The real hf backend with the first sample's aux state recaptured into other values that keep
    its Parquet page's CRC32: a CRC-32 codeword XORed into the state's first 33 bits. A page header
    stores its CRC as a varint, whose length follows the value, so other values in general change a
    shard's size by a byte or so; these keep it, by construction: the same rows in other values of
    the same size, as another GPU's kernels give."""

    def __init__(self, inner) -> None:
        self.inner, self.hidden_size, self.recaptured = inner, inner.hidden_size, False

    def forward(self, batch_ids: list[list[int]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for aux, last in self.inner.forward(batch_ids):
            if not self.recaptured:
                aux, self.recaptured = _xor_codeword(aux), True
            yield aux, last


def _xor_codeword(state: torch.Tensor) -> torch.Tensor:
    """``state`` (float32) with ``CRC32_CODEWORD`` XORed into its bytes at the first float boundary
    where the result stays finite (a non-finite state would be quarantined, not rebuilt)."""
    raw = bytearray(state.detach().to(torch.float32).contiguous().numpy().tobytes())
    for start in range(0, len(raw) - 5, 4):
        window = int.from_bytes(raw[start : start + 5], "little") ^ CRC32_CODEWORD
        changed = raw[:start] + window.to_bytes(5, "little") + raw[start + 5 :]
        out = torch.frombuffer(changed, dtype=torch.float32).reshape(state.shape).clone()
        if torch.isfinite(out).all():
            return out
    raise AssertionError("no float boundary takes the codeword and stays finite")


def _entries(out_dir) -> dict[str, FileEntry]:
    return {e.path: e for e in Manifest.read(out_dir).files}


def _damage_in_place(path) -> None:
    """Flip one byte inside the aux_hidden column chunk of row group 0: same size, the footer
    intact."""
    column = (
        pq.ParquetFile(path).metadata.row_group(0).column(FEATURE_SCHEMA.names.index("aux_hidden"))
    )
    data = bytearray(path.read_bytes())
    data[column.data_page_offset + column.total_compressed_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_shard_no_finalize_saw_written_is_listed_with_its_writers_hashes_and_its_damage_refused(
    make_config, regen_shard, hf_backend, tmp_path, record_hashes
):
    """The run that wrote shard 3 was killed before its stage finished (or another shard failed and
    a later run re-triggers it): the process that finalizes never saw shard 3 written, and still
    reads nothing back. A file nothing recorded in a form that parses is hashed as it is now,
    without a footer hash (the loader then hashes all of it)."""
    config = make_config("capture.aux_layers=[2,4,5]")
    out_dir = tmp_path / "features" / "fp"
    capture_shard(config, regen_shard, out_dir, backend=hf_backend)
    shard, quarantine, _ = output_paths(out_dir, 3)
    sha256 = runroot.sha256_file
    hashed = record_hashes(runroot)

    finalize_features(config, out_dir, [])
    assert hashed == []
    verify_files([shard, quarantine], rebuild="-")  # the writer's sha256 is the file's
    footers = {name: e.footer_sha256 for name, e in _entries(out_dir).items()}
    assert footers == {f.name: footer_sha256(f) for f in (shard, quarantine)}

    _damage_in_place(shard)  # between two nights
    # an earlier night's manifest, or none: the writer's hashes refuse it
    for manifest_kept in (True, False):
        if not manifest_kept:
            (out_dir / "manifest.json").unlink()
        finalize_features(config, out_dir, [])
        assert hashed == []
        with pytest.raises(DataError, match=rf"{shard}: sha256 differs"):
            verify_files([shard], rebuild="-")

    # torn by a disk that lied about a sync
    (out_dir / hashes_file_name(3)).write_text('{"shard-00003.parquet": ')
    (out_dir / "manifest.json").unlink()
    finalize_features(config, out_dir, [3])
    assert sorted(hashed) == sorted([shard, quarantine])
    assert (_entries(out_dir)[shard.name].sha256, _entries(out_dir)[shard.name].footer_sha256) == (
        sha256(shard),
        None,
    )


def _killed_before_its_hashes(monkeypatch, capture) -> None:
    """Run ``capture()`` with a kill between the shard's rename and its hashes
    (``PartWriter.finish``'s crash window): the build's first record (``{}``: it knows nothing yet)
    is written, the second (its hashes) never."""
    from eagle3.capture import writer

    write_json, calls = writer.atomic_write_json, []

    def killed_at_the_second(*args):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        write_json(*args)

    monkeypatch.setattr(writer, "atomic_write_json", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        capture()
    monkeypatch.undo()


@pytest.mark.parametrize("killed_before_its_hashes", [False, True])
def test_a_shard_rebuilt_into_other_bytes_of_the_same_size_is_listed_with_the_rebuilds_hashes(
    make_config, regen_shard, hf_backend, tmp_path, monkeypatch, killed_before_its_hashes
):
    """Uncompressed states recaptured on another GPU can be other values in a file of the same size
    (here built so: ``Recaptured``): the earlier build's hashes must not stand for it, or the loader
    refuses the good rebuild as damaged. A rebuild killed between its shard and its hashes leaves
    neither build's hashes: its resume records the rebuild's."""
    config = make_config("capture.aux_layers=[2,4,5]", "capture.hidden_compression=none")
    out_dir = tmp_path / "features" / "fp"
    capture_shard(config, regen_shard, out_dir, backend=hf_backend)
    finalize_features(config, out_dir, [3])
    shard, quarantine, parts = output_paths(out_dir, 3)
    before = shard.read_bytes()
    shard.unlink()  # the refusal's fix
    if killed_before_its_hashes:
        rebuild = lambda: capture_shard(  # noqa: E731
            config, regen_shard, out_dir, backend=Recaptured(hf_backend)
        )
        _killed_before_its_hashes(monkeypatch, rebuild)
        assert (
            shard.exists()
            and parts.exists()
            and json.loads((out_dir / hashes_file_name(3)).read_text()) == {}
        )
        # the resume
        assert capture_shard(config, regen_shard, out_dir, backend=hf_backend)["skipped"]
    else:
        capture_shard(config, regen_shard, out_dir, backend=Recaptured(hf_backend))
    after = shard.read_bytes()
    assert len(after) == len(before) and after != before
    finalize_features(config, out_dir, [3])
    verify_files([shard, quarantine], rebuild="-")
    assert _entries(out_dir)[shard.name].footer_sha256 == footer_sha256(shard)


def test_a_shard_killed_between_its_rename_and_its_hashes_is_recorded_on_resume_as_an_unbroken_run_records_it(
    make_config, regen_shard, hf_backend, tmp_path, monkeypatch
):
    """The crash window's resume skips the finished shard and records its hashes (after checking its
    pages), so its ``hashes-NNNNN.json`` and manifest entries are those of an unbroken run: footer
    hashes included, with which the loader checks pages instead of every byte at every start."""
    config = make_config("capture.aux_layers=[2,4,5]")
    unbroken, killed = tmp_path / "unbroken" / "fp", tmp_path / "killed" / "fp"
    capture_shard(config, regen_shard, unbroken, backend=hf_backend)
    finalize_features(config, unbroken, [3])
    _killed_before_its_hashes(
        monkeypatch, lambda: capture_shard(config, regen_shard, killed, backend=hf_backend)
    )
    assert json.loads((killed / hashes_file_name(3)).read_text()) == {}

    assert capture_shard(config, regen_shard, killed, backend=hf_backend)["skipped"]
    finalize_features(config, killed, [3])
    assert (killed / hashes_file_name(3)).read_text() == (
        unbroken / hashes_file_name(3)
    ).read_text()
    assert _entries(killed) == _entries(unbroken) and all(
        e.footer_sha256 for e in _entries(killed).values()
    )


def test_a_crash_window_shard_with_a_damaged_page_is_rebuilt_not_recorded(
    make_config, regen_shard, hf_backend, tmp_path, monkeypatch
):
    """A shard left by the crash window and damaged before its resume fails its page check there: it
    is rebuilt, and the hashes recorded are the rebuild's, never the damaged bytes'."""
    config = make_config("capture.aux_layers=[2,4,5]")
    out_dir = tmp_path / "features" / "fp"
    _killed_before_its_hashes(
        monkeypatch, lambda: capture_shard(config, regen_shard, out_dir, backend=hf_backend)
    )
    shard = output_paths(out_dir, 3)[0]
    good = shard.read_bytes()
    _damage_in_place(shard)

    # rebuilt
    assert capture_shard(config, regen_shard, out_dir, backend=hf_backend)["skipped"] is False
    assert shard.read_bytes() == good
    finalize_features(config, out_dir, [3])
    verify_files([shard], rebuild="-")
    assert _entries(out_dir)[shard.name].footer_sha256 == footer_sha256(shard)


def test_a_night_whose_other_shard_failed_is_re_triggered_without_reading_the_finished_shard_back(
    make_config, two_regen_shards, monkeypatch, record_hashes
):
    """Shard 3 finished and shard 4 failed, so the night wrote no manifest; the re-trigger captures
    shard 4 alone and lists shard 3 with its writer's hashes, footers included, so the loader checks
    pages, not whole files."""
    import eagle3.capture.stage as stage_module

    capture = stage_module.capture_shard

    def shard_4_fails(config, regen_shard, out_dir, **kwargs):
        if shard_index_of(regen_shard) == 4:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return capture(config, regen_shard, out_dir, **kwargs)

    monkeypatch.setattr(stage_module, "capture_shard", shard_4_fails)
    config = make_config()
    with pytest.raises(UnitsFailed, match="--shard 4"):
        run_stage(CaptureStage(), config, regen_dir=two_regen_shards)
    monkeypatch.undo()
    hashed = record_hashes(runroot)
    result = run_stage(CaptureStage(), config, regen_dir=two_regen_shards, shard_ids=[4])
    assert hashed == []
    entries = _entries(result.out_dir)
    assert len(entries) == 4 and all(
        e.footer_sha256 == footer_sha256(result.out_dir / n) for n, e in entries.items()
    )


def test_following_the_loaders_refusal_rebuilds_only_the_damaged_shard_and_the_loader_then_reads_every_row(
    make_config, two_regen_shards, monkeypatch, record_hashes
):
    """The refusal says what to do: delete the damaged shard, run `eagle3 capture`. That alone
    rebuilds it: the other shard is skipped, nothing is read back to be hashed, and the loader reads
    both shards' rows."""
    import eagle3.capture.stage as stage_module

    config = make_config()
    result = run_stage(CaptureStage(), config, regen_dir=two_regen_shards)
    damaged = result.out_dir / "shard-00004.parquet"
    good = damaged.read_bytes()
    _damage_in_place(damaged)
    with pytest.raises(DataError) as refused:
        list(FeatureDataset(result.out_dir, batch_size=1, shuffle=False))
    assert f"{damaged} row group 0: does not read back" in str(refused.value)
    assert "Fix: delete the damaged file(s), then run `eagle3 capture`" in str(refused.value)

    damaged.unlink()
    captured, capture = [], stage_module.capture_shard
    monkeypatch.setattr(
        stage_module,
        "capture_shard",
        lambda config, regen_shard, out_dir, **kw: (
            out := capture(config, regen_shard, out_dir, **kw),
            out["skipped"] or captured.append(out["shard_index"]),
        )[0],
    )
    finalized, verified = record_hashes(runroot), record_hashes(integrity)
    run_stage(CaptureStage(), config, regen_dir=two_regen_shards)
    assert captured == [4] and finalized == [] and damaged.read_bytes() == good
    loader = FeatureDataset(result.out_dir, batch_size=1, shuffle=False)
    assert (
        sum(batch["input_ids"].shape[0] for batch in loader)
        == Manifest.read(result.out_dir).stats["rows"]
        > 12
    )
    assert verified == []
