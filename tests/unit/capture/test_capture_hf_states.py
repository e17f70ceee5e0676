"""The hf backend stores exactly the target's states: aux = output_hidden_states[i], last =
post-norm final state."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from eagle3.capture.encoding import column_codecs
from eagle3.capture.hf import HFBackend
from eagle3.capture.schema import FEATURE_SCHEMA
from eagle3.capture.shard import capture_shard, read_regen_shard
from eagle3.data.parquet import open_shard, shard_metadata


@pytest.fixture(scope="module")
def tiny_model(capture_model_dir):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(capture_model_dir, dtype=torch.float32).eval()


def _stored(path, hidden: int) -> dict[str, tuple[list[int], torch.Tensor, torch.Tensor]]:
    table = pq.read_table(path)
    aux_codec, last_codec = column_codecs("raw", "float32", hidden)
    aux = [v for v, _ in aux_codec.views(table.column("aux_hidden"))]
    last = [v for v, _ in last_codec.views(table.column("last_hidden"))]
    ids = table.column("input_ids").to_pylist()
    return {
        sid: (ids[i], aux[i], last[i])
        for i, sid in enumerate(table.column("sample_id").to_pylist())
    }


def _reference(model, ids: list[int]):
    pre_norm = {}
    handle = model.model.layers[-1].register_forward_hook(
        lambda _m, _i, out: pre_norm.setdefault("x", out)
    )
    with torch.inference_mode():
        x = torch.tensor([ids])
        out = model(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            output_hidden_states=True,
            use_cache=False,
        )
    handle.remove()
    return out, pre_norm["x"][0]


def test_unpadded_capture_equals_output_hidden_states_exactly(
    make_config, regen_shard, tiny_model, tmp_path
):
    # one sample per batch: no padding, same shapes as reference
    config = make_config("capture.batch_tokens=1")
    backend = HFBackend(tiny_model, config.sglang_layer_ids, hidden_size=config.target.hidden_size)
    result = capture_shard(config, regen_shard, tmp_path / "features" / "fp", backend=backend)
    assert result["rows"] == 12 and result["quarantined"] == 0
    stored = _stored(result["path"], config.target.hidden_size)
    for sid, (ids, aux, last) in list(stored.items())[:4]:
        out, pre_norm = _reference(tiny_model, ids)
        expected_aux = torch.cat([out.hidden_states[i][0] for i in config.sglang_layer_ids], dim=-1)
        assert torch.equal(aux, expected_aux), sid
        # post-norm, from the lm_head input
        assert torch.equal(last, tiny_model.model.norm(pre_norm)), sid
        assert out.logits.shape[1] == len(ids)
        torch.testing.assert_close(tiny_model.lm_head(last), out.logits[0], atol=1e-5, rtol=0)


def test_padded_batches_match_single_sample_forward(make_config, regen_shard, tiny_model, tmp_path):
    config = make_config("capture.batch_tokens=4096")
    backend = HFBackend(tiny_model, config.sglang_layer_ids, hidden_size=config.target.hidden_size)
    result = capture_shard(config, regen_shard, tmp_path / "features" / "fp", backend=backend)
    stored = _stored(result["path"], config.target.hidden_size)
    inputs = {s.sample_id: s.input_ids for s in read_regen_shard(regen_shard)}
    assert set(stored) == set(inputs)
    for sid, (ids, aux, last) in stored.items():
        assert ids == inputs[sid]
        out, _ = _reference(tiny_model, ids)
        expected_aux = torch.cat([out.hidden_states[i][0] for i in config.sglang_layer_ids], dim=-1)
        torch.testing.assert_close(aux, expected_aux, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(tiny_model.lm_head(last), out.logits[0], atol=1e-5, rtol=0)


def test_shard_footer_records_lineage_and_layout(
    make_config, regen_shard, tiny_model, tmp_path, capture_tokenizer
):
    from eagle3.data.template import template_hash

    config = make_config()
    backend = HFBackend(tiny_model, config.sglang_layer_ids, hidden_size=config.target.hidden_size)
    out_dir = tmp_path / "features" / "fp"
    result = capture_shard(config, regen_shard, out_dir, backend=backend)
    assert result["path"].endswith("shard-00003.parquet")  # same index as the regen shard
    open_shard(result["path"], schema=FEATURE_SCHEMA)
    meta = shard_metadata(result["path"])
    assert meta["layer_ids"] == str(config.sglang_layer_ids).replace(" ", "").replace(",", ", ")
    assert meta["layer_convention"] == "input_of_layer"
    assert meta["dtype"] == "float32" and meta["hidden_size"] == str(config.target.hidden_size)
    assert meta["chat_template_hash"] == template_hash(capture_tokenizer)
    assert meta["truncation"] == "quarantine" and meta["features_fingerprint"] == "fp"


def test_bfloat16_capture_stores_bf16_bytes(make_config, regen_shard, capture_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    config = make_config("capture.dtype=bfloat16")
    model = AutoModelForCausalLM.from_pretrained(capture_model_dir, dtype=torch.bfloat16).eval()
    backend = HFBackend(model, config.sglang_layer_ids)
    result = capture_shard(config, regen_shard, tmp_path / "features" / "fp", backend=backend)
    table = pq.read_table(result["path"])
    seq = table.column("seq_len").to_pylist()
    assert [len(b) for b in table.column("last_hidden").to_pylist()] == [n * 128 * 2 for n in seq]
    aux = [v for v, _ in column_codecs("raw", "bfloat16", 128)[0].views(table.column("aux_hidden"))]
    assert aux[0].dtype == torch.bfloat16 and torch.isfinite(aux[0].float()).all()
