"""The vocab stage: top ids by loss-masked count, ascending, padded with unseen ids; built once per
features set."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from eagle3.capture.stage import FeatureSource
from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.config.target import TargetConfig
from eagle3.data.parquet import ShardWriter
from eagle3.model.vocab import load_vocab
from eagle3.rundir.runroot import FileEntry, Manifest
from eagle3.train.vocab import build_vocab, build_vocab_stage, count_tokens, coverage

SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.uint8())),
    ]
)


def _shard(out_dir, index, rows):
    with ShardWriter(out_dir, SCHEMA, start_index=index) as writer:
        writer.write_rows(
            [
                {"sample_id": f"s{index}-{i}", "input_ids": ids, "loss_mask": mask}
                for i, (ids, mask) in enumerate(rows)
            ]
        )
        (info,) = writer.close()
    return info


def test_counts_only_loss_masked_positions(tmp_path):
    a = _shard(tmp_path, 0, [([5, 6, 7, 7], [0, 1, 1, 1])])
    b = _shard(tmp_path, 1, [([7, 9], [1, 0]), ([3], [1])])
    counts = count_tokens([a.path, b.path], vocab_size=12)
    assert counts.tolist() == [0, 0, 0, 1, 0, 0, 1, 3, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="vocab_size=5"):
        count_tokens([a.path], vocab_size=5)


def test_a_damaged_token_page_is_refused_naming_the_shard_not_counted(tmp_path):
    import pyarrow.parquet as pq

    from eagle3.errors import DataError

    info = _shard(tmp_path, 0, [(list(range(i, i + 50)), [1] * 50) for i in range(20)])
    column = pq.ParquetFile(info.path).metadata.row_group(0).column(SCHEMA.names.index("input_ids"))
    data = bytearray(info.path.read_bytes())
    data[column.data_page_offset + column.total_compressed_size // 2] ^= 0x01
    info.path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"{info.path}: does not read back.*eagle3 capture"):
        count_tokens([info.path], vocab_size=100)


def test_top_ids_by_count_ties_to_lower_id_sorted_ascending():
    counts = torch.tensor([0, 5, 2, 5, 9, 2, 0, 1])
    vocab = build_vocab(counts, 4)
    # 4(9), 1(5), 3(5), then 2 beats 5 on the tie at 2
    assert vocab.target_ids.tolist() == [1, 2, 3, 4]
    assert vocab.d2t.dtype == torch.int64 and vocab.d2t.tolist() == [1, 1, 1, 1]
    assert torch.nonzero(vocab.t2d).flatten().tolist() == [1, 2, 3, 4]
    assert coverage(counts, vocab) == pytest.approx(21 / 24)


def test_draft_vocab_larger_than_distinct_ids_pads_with_lowest_unseen_ids():
    counts = torch.zeros(100, dtype=torch.int64)
    counts[[50, 70, 99]] = torch.tensor([3, 2, 1])
    vocab = build_vocab(counts, 6)
    assert vocab.draft_vocab_size == 6
    assert vocab.target_ids.tolist() == [0, 1, 2, 50, 70, 99]
    chosen = vocab.target_ids
    assert torch.equal(torch.arange(6) + vocab.d2t, chosen)  # target_id = draft_id + d2t[draft_id]
    assert coverage(counts, vocab) == 1.0


def test_draft_vocab_never_exceeds_target_vocab():
    with pytest.raises(ValueError, match=r"set vocab\.draft_vocab_size <= 10"):
        build_vocab(torch.ones(10, dtype=torch.int64), 11)


def test_vocab_stage_builds_once_from_the_features_manifest(tmp_path):
    features = tmp_path / "root" / "features" / "featfp"
    infos = [
        _shard(features, 0, [([1, 2, 2, 3], [1, 1, 1, 0])]),
        _shard(features, 1, [([2, 4], [1, 1])]),
    ]
    Manifest(
        stage="features",
        fingerprint="featfp",
        files=[FileEntry.of(i.path, rows=i.rows, base=features) for i in infos],
    ).write(features)
    base = PipelineConfig(
        name="v",
        root=str(tmp_path / "root"),
        target=TargetConfig(model_path="x", num_layers=8, hidden_size=8, vocab_size=16),
    )
    config = with_overrides(base, ["vocab.draft_vocab_size=4"])
    out = build_vocab_stage(config, FeatureSource.stored(features))
    assert out.name == "vocab.safetensors"
    vocab = load_vocab(out)
    assert vocab.target_ids.tolist() == [0, 1, 2, 4]
    manifest = Manifest.read(out.parent)
    assert manifest.stats["coverage"] == 1.0 and manifest.stats["distinct_ids"] == 3
    mtime = out.stat().st_mtime_ns
    assert build_vocab_stage(config, FeatureSource.stored(features)) == out
    assert out.stat().st_mtime_ns == mtime


def test_a_token_page_header_damaged_into_garbage_is_refused_in_one_printable_line(tmp_path):
    """Arrow's error for a page header it cannot parse spans lines and quotes the raw byte; the
    refusal is the one ``error:`` line a command prints, so it stays one printable line."""
    import pyarrow.parquet as pq

    from eagle3.errors import DataError

    info = _shard(tmp_path, 0, [(list(range(i, i + 50)), [1] * 50) for i in range(20)])
    column = pq.ParquetFile(info.path).metadata.row_group(0).column(SCHEMA.names.index("input_ids"))
    data = bytearray(info.path.read_bytes())
    start = column.dictionary_page_offset or column.data_page_offset
    data[start : start + 8] = bytes(b ^ 0xFF for b in data[start : start + 8])
    info.path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"{info.path}: does not read back") as refused:
        count_tokens([info.path], vocab_size=100)
    message = str(refused.value)
    assert message.isprintable() and message.endswith(
        "then run `eagle3 capture` to rebuild them"
    ), message
