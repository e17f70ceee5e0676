"""A target is measured at the size it reaches once loaded for capture, before any weight loads, and
refused when that does not fit the capture's devices. A compressed-tensors INT4 target (Kimi-K2.5's
format) counts at its decompressed size: transformers loads it packed and decompresses every weight
at the first forward."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from eagle3.capture.budget import human_bytes
from eagle3.capture.encoding import column_codecs
from eagle3.capture.footprint import CaptureMemoryError, capture_footprint, check_fits
from eagle3.capture.hf import load_hf_backend
from eagle3.capture.shard import capture_shard
from eagle3.model.target_weights import load_target_head


def _parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_an_int4_target_is_counted_at_the_size_its_first_forward_decompresses_it_to(
    make_config, int4_model_dir
):
    config = make_config(f"target.model_path={int4_model_dir}")
    footprint = capture_footprint(config)
    backend = load_hf_backend(config)
    as_loaded = _parameter_bytes(backend.model)
    next(backend.forward([[5, 6, 7]]))
    assert footprint.quant_method == "compressed-tensors"
    # placed packed (4.4 of 8.1 MB): what a device_map is sized for
    assert as_loaded < 0.6 * footprint.weights
    # what the first forward leaves on the device
    assert footprint.weights == _parameter_bytes(backend.model)
    assert footprint.weights > 3 * footprint.stored


def test_a_dense_target_is_counted_in_the_capture_dtype(make_config, capture_model_dir):
    from transformers import AutoModelForCausalLM

    stored = _parameter_bytes(
        AutoModelForCausalLM.from_pretrained(capture_model_dir, dtype=torch.float32)
    )
    footprint = capture_footprint(make_config("capture.dtype=bfloat16", "capture.batch_tokens=100"))
    assert footprint.quant_method is None
    assert (footprint.stored, footprint.weights) == (stored, stored // 2)
    assert footprint.activations == 100 * 128 * 9 * 2  # tokens x H x (layers + 1) x bf16


def test_an_int4_target_that_fits_packed_but_not_decompressed_is_refused(
    make_config, int4_model_dir
):
    config = make_config(f"target.model_path={int4_model_dir}")
    footprint = capture_footprint(config)
    check_fits(footprint, footprint.total, config=config)
    # room for the checkpoint as stored, and for one batch
    free = footprint.stored + footprint.activations
    expected = (
        f"its {human_bytes(footprint.stored)} compressed-tensors checkpoint is decompressed to float32 at "
        f"the first forward, .* need {human_bytes(footprint.total)}, but {human_bytes(free)} is free"
    )
    with pytest.raises(CaptureMemoryError, match=expected):
        check_fits(footprint, free, config=config)


def test_a_capture_that_cannot_fit_this_machine_is_refused_before_the_target_loads(
    make_config, monkeypatch
):
    from transformers import AutoModelForCausalLM

    def never(*_args, **_kwargs):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", never)
    config = make_config("capture.batch_tokens=1000000000")  # 4.6 TB of float32 states in one batch
    with pytest.raises(
        CaptureMemoryError,
        match=r"4\.61 TB of hidden states for capture\.batch_tokens="
        r"1,000,000,000 .* is free on capture.device='cpu'",
    ):
        load_hf_backend(config)


def test_capture_from_an_int4_target_stores_the_states_of_its_decompressed_weights(
    make_config, int4_model_dir, capture_model_dir, regen_shard, tmp_path
):
    from transformers import AutoModelForCausalLM

    config = make_config(f"target.model_path={int4_model_dir}", "capture.batch_tokens=1")
    result = capture_shard(
        config, regen_shard, tmp_path / "features", backend=load_hf_backend(config)
    )
    assert (result["rows"], result["quarantined"]) == (12, 0)
    table = pq.read_table(result["path"], columns=["input_ids", "aux_hidden"]).slice(0, 3)
    aux_codec, _ = column_codecs("raw", "float32", config.target.hidden_size)
    int4 = AutoModelForCausalLM.from_pretrained(int4_model_dir, dtype=torch.float32).eval()
    dense = AutoModelForCausalLM.from_pretrained(capture_model_dir, dtype=torch.float32).eval()
    rows = zip(
        table.column("input_ids").to_pylist(),
        aux_codec.views(table.column("aux_hidden")),
        strict=True,
    )
    for ids, (aux, _) in rows:
        states = {}
        for name, model in (("int4", int4), ("dense", dense)):
            with torch.inference_mode():
                out = model(
                    input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False
                )
            states[name] = torch.cat(
                [out.hidden_states[i][0] for i in config.sglang_layer_ids], dim=-1
            )
        assert torch.equal(aux, states["int4"])
        # the quantized weights were the ones used
        assert not torch.allclose(aux, states["dense"], atol=1e-3)


def test_the_draft_reads_an_int4_targets_embedding_and_head_as_its_dense_source_has_them(
    int4_model_dir, capture_model_dir
):
    int4, dense = load_target_head(str(int4_model_dir)), load_target_head(str(capture_model_dir))
    assert torch.equal(int4.embed, dense.embed.bfloat16()) and torch.equal(
        int4.lm_head, dense.lm_head.bfloat16()
    )
    assert not int4.tied


def test_a_hub_target_in_the_hf_cache_is_measured_offline(
    make_config, int4_model_dir, tmp_path, monkeypatch
):
    import shutil

    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--org--tiny-int4"
    shutil.copytree(int4_model_dir, repo / "snapshots" / "0123abc")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # a header request to the Hub would fail
    cached = capture_footprint(make_config("target.model_path=org/tiny-int4"))
    assert cached == capture_footprint(make_config(f"target.model_path={int4_model_dir}"))
