"""Feature encodings: fp8 keeps each value within its rounding, top-k ids and probabilities read
back exactly, a capture records its encoding, and the disk budget refuses a capture that does not
fit before anything is written."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest
import torch

from eagle3.capture.budget import DiskBudgetError, capture_estimate, night_estimate, regen_tokens
from eagle3.capture.encoding import TopKCodec, bytes_per_token, column_codecs, dequantize, quantize
from eagle3.capture.stage import CaptureStage, features_dir_for
from eagle3.config.base import ConfigError
from eagle3.data.parquet import shard_metadata
from eagle3.recipes import load_recipe
from eagle3.rundir.runroot import Manifest
from eagle3.stage import run_stage


def test_fp8_round_trip_stays_within_one_rounding_per_segment():
    # layers of growing scale
    x = torch.randn(5, 3 * 64) * torch.tensor([1.0, 30.0, 900.0]).repeat_interleave(64)
    values, scales = quantize(x, 3)
    assert values.dtype == torch.float8_e4m3fn and scales.shape == (5, 3)
    back = dequantize(values, scales, torch.float32)
    segment_max = x.abs().unflatten(-1, (3, 64)).amax(-1).repeat_interleave(64, dim=-1)
    # 3 mantissa bits (+ subnormals)
    assert ((back - x).abs() <= x.abs() / 16 + segment_max * 2**-9 / 448 * 8).all()


def test_codec_views_read_back_what_encode_wrote():
    import pyarrow as pa

    aux_codec, last_codec = column_codecs("fp8_all", "bfloat16", 16)
    x = torch.randn(7, 48)
    ((values, scales),) = aux_codec.views(pa.array([aux_codec.encode(x)], pa.binary()))
    assert torch.equal(
        dequantize(values, scales, torch.float32), dequantize(*quantize(x, 3), torch.float32)
    )
    assert last_codec.bytes_per_token == 16 + 4 and aux_codec.bytes_per_token == 48 + 12


def test_bytes_per_token_of_each_encoding_at_kimi_size():
    h = 7168
    assert bytes_per_token("raw", "bfloat16", h) == 8 * h + 5
    assert bytes_per_token("fp8_aux", "bfloat16", h) == 3 * h + 12 + 2 * h + 5
    assert bytes_per_token("fp8_all", "bfloat16", h) == 4 * h + 16 + 5
    assert bytes_per_token("fp8_topk", "bfloat16", h, topk=64) == 3 * h + 12 + 6 * 64 + 5
    night = night_estimate(load_recipe("kimi_k2_5"))
    assert night["prompts"] == 88_088 and night["bytes"]["raw"].endswith("TB")
    ratios = night["bytes_per_token_over_8H"]
    assert (
        night["encoding"] == "fp8_topk"
        and ratios["fp8_topk"] < ratios["fp8_all"] < ratios["fp8_aux"]
    )
    # 4 threads x 1,000 prompts x 1,500 tokens x (3 * 7168 + 12 + 6 * 256 + 5) B
    assert night["part_files_at_peak"] == "4 of 89 shards capturing at once: 138.34 GB"


def test_topk_codec_reads_back_the_ids_and_float16_probabilities_exactly():
    import pyarrow as pa

    _, codec = column_codecs("fp8_topk", "bfloat16", 16, topk=5)
    assert isinstance(codec, TopKCodec) and codec.bytes_per_token == 5 * (4 + 2)
    ids = torch.randint(0, 200_000, (7, 5))  # beyond 65K: int32 ids
    probs = torch.softmax(torch.randn(7, 5), -1).half()
    ((got_ids, got_probs),) = codec.views(pa.array([codec.encode(ids, probs)], pa.binary()))
    assert got_ids.dtype == torch.int32 and torch.equal(got_ids.long(), ids)
    assert got_probs.dtype == torch.float16 and torch.equal(got_probs, probs)
    with pytest.raises(ValueError, match=r"capture\.topk"):
        column_codecs("fp8_topk", "bfloat16", 16)


def test_topk_outside_one_to_the_vocab_is_a_config_error(make_config):
    vocab = make_config().target.vocab_size
    for k in (0, vocab + 1):
        with pytest.raises(
            ConfigError, match=rf"capture.topk={k} is outside \[1, target.vocab_size={vocab}\]"
        ):
            make_config("capture.encoding=fp8_topk", f"capture.topk={k}")


def test_topk_capture_stores_the_targets_top_k_next_token_distribution(make_config, regen_shard):
    """The stored ids are the target's own top-k (HF's logits, computed apart from the capture hook)
    and the probabilities its full-vocab softmax within float16 rounding; footer and manifest record
    k."""
    from transformers import AutoModelForCausalLM

    config = make_config("capture.encoding=fp8_topk", "capture.topk=8")
    result = run_stage(CaptureStage(), config, regen_dir=regen_shard.parent)
    shard = next(result.out_dir.glob("shard-*.parquet"))
    meta = shard_metadata(shard)
    assert meta["encoding"] == "fp8_topk" and meta["topk"] == "8"
    assert Manifest.read(result.out_dir).stats["footer"]["topk"] == "8"
    table = pq.read_table(shard)
    _, codec = column_codecs("fp8_topk", "float32", config.target.hidden_size, topk=8)
    (ids, probs), *_ = codec.views(table.column("last_hidden"))
    model = AutoModelForCausalLM.from_pretrained(
        config.target.model_path, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        logits = model(torch.tensor([table.column("input_ids")[0].as_py()])).logits[0]
    want = torch.softmax(logits, -1).topk(8, -1)
    assert torch.equal(ids.long(), want.indices)
    torch.testing.assert_close(probs.float(), want.values, rtol=2**-11, atol=2**-24)
    assert result.out_dir != features_dir_for(
        make_config("capture.encoding=fp8_topk", "capture.topk=16"), regen_shard.parent
    )  # k is part of the stage


def test_fp8_capture_records_its_encoding_and_stores_fewer_bytes(
    make_config, regen_shard, tmp_path
):
    config = make_config("capture.encoding=fp8_aux")
    result = run_stage(CaptureStage(), config, regen_dir=regen_shard.parent)
    shard = next(result.out_dir.glob("shard-*.parquet"))
    assert shard_metadata(shard)["encoding"] == "fp8_aux"
    manifest = Manifest.read(result.out_dir)
    assert (
        manifest.config["capture"]["encoding"] == "fp8_aux"
        and manifest.stats["footer"]["encoding"] == "fp8_aux"
    )
    table = pq.read_table(shard, columns=["seq_len", "aux_hidden", "last_hidden"])
    h = config.target.hidden_size
    tokens = sum(table.column("seq_len").to_pylist())
    assert sum(len(v) for v in table.column("aux_hidden").to_pylist()) == tokens * (3 * h + 12)
    # float32, raw
    assert sum(len(v) for v in table.column("last_hidden").to_pylist()) == tokens * 4 * h
    # another stage than raw
    assert result.out_dir != features_dir_for(make_config(), regen_shard.parent)


def test_capture_is_refused_before_writing_when_the_estimate_does_not_fit(make_config, regen_shard):
    free = shutil.disk_usage(regen_shard.parent).free
    # estimate + reserve > free, whatever the disk
    config = make_config(f"capture.disk_reserve_bytes={free}")
    out = features_dir_for(config, regen_shard.parent)
    estimate = capture_estimate(config, [regen_shard])
    assert (
        estimate.tokens
        == regen_tokens(regen_shard)
        == sum(
            len(ids)
            for ids in pq.read_table(regen_shard, columns=["input_ids"]).column(0).to_pylist()
        )
    )
    with pytest.raises(DiskBudgetError) as refused:
        run_stage(CaptureStage(), config, regen_dir=regen_shard.parent)
    message = str(refused.value)
    assert (
        f"{estimate.tokens:,} tokens" in message
        and "free at" in message
        and "disk_reserve_bytes" in message
    )
    assert not out.exists() and not (config.root_path / "features").exists()  # nothing written
    assert json.dumps(message).count("\\n") == 0  # one line


def test_every_finite_fp8_value_decodes_exactly():
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    finite = ~codes.float().isnan()
    decoded = dequantize(codes[finite], torch.ones(1), torch.float32)
    assert torch.equal(decoded, codes[finite].float())


def test_the_budget_keeps_room_for_the_part_files_of_every_shard_that_runs_at_once(
    make_config, tmp_path
):
    """Four shards captured on four threads hold four shards' part files at once: the budget adds
    the largest that can run together, bounded by capture.shards_in_flight (which also bounds the
    stage), else by the runner."""
    from eagle3.data.parquet import ShardWriter
    from eagle3.regen.schema import REGEN_SCHEMA

    shards = []
    for index, n in enumerate([10, 40, 20, 30]):
        with ShardWriter(tmp_path, REGEN_SCHEMA, start_index=index) as writer:
            writer.write_rows(
                [
                    {
                        "sample_id": f"s{index}",
                        "input_ids": [5] * n,
                        "loss_mask": [1] * n,
                        "status": "ok",
                    }
                ]
            )
        shards.append(writer.close()[0].path)

    def parts_tokens(*overrides: str) -> tuple[int, int]:
        estimate = capture_estimate(make_config(*overrides), shards)
        assert estimate.tokens == 100
        return estimate.shards_at_once, estimate.parts_tokens

    assert parts_tokens("orchestration.max_workers=2") == (2, 70)
    assert parts_tokens("orchestration.max_workers=8") == (4, 100)  # no more than there are shards
    assert parts_tokens("orchestration.max_workers=8", "capture.shards_in_flight=1") == (1, 40)
    # a local Ray
    assert parts_tokens("orchestration.task_runner=ray", "orchestration.max_workers=3") == (3, 90)
    remote = ("orchestration.task_runner=ray", "orchestration.ray_address=ray://head:10001")
    assert parts_tokens(*remote) == (4, 100)  # as many as its GPUs fit: every shard, unless bounded
    assert parts_tokens(*remote, "capture.shards_in_flight=2") == (2, 70)
    assert CaptureStage().max_in_flight(make_config("capture.shards_in_flight=2")) == 2


def test_a_capture_run_first_deletes_parts_a_killed_run_left_half_removed(make_config, regen_shard):
    config = make_config()
    stale = features_dir_for(config, regen_shard.parent) / ".removed-parts-00003-0a1b2c3d"
    stale.mkdir(parents=True)
    (stale / "shard-00003.part-00000.parquet").write_bytes(b"x" * 1000)
    result = run_stage(CaptureStage(), config, regen_dir=regen_shard.parent)
    assert result.done and not stale.exists()
