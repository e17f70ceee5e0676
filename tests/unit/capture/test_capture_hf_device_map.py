"""A target spread by transformers' ``device_map`` (``capture.device=auto``, the large recipes')
captures what one device captures, and one that does not fit its devices is refused when it loads,
before any shard is written.

This machine has no GPU, so a spread over GPUs cannot run here: on CPU the strategies place the
whole target on the CPU, which still takes the accelerate-backed loading path. The refusal is
modelled as accelerate does it on a node whose GPUs are too small: modules offloaded to CPU or disk
have their parameters on ``meta``."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from eagle3.capture.hf import HFBackend, load_hf_backend
from eagle3.capture.shard import capture_shard


def _states(path) -> dict[str, tuple[bytes, bytes]]:
    table = pq.read_table(path, columns=["sample_id", "aux_hidden", "last_hidden"])
    return {row["sample_id"]: (row["aux_hidden"], row["last_hidden"]) for row in table.to_pylist()}


def _captured(
    make_config, regen_shard, tmp_path, devices
) -> dict[str, dict[str, tuple[bytes, bytes]]]:
    """The stored states of one shard captured with each ``capture.device`` in ``devices``."""
    stored = {}
    for device in devices:
        config = make_config(f"capture.device={device}")
        result = capture_shard(
            config, regen_shard, tmp_path / device, backend=load_hf_backend(config)
        )
        stored[device] = _states(result["path"])
    return stored


def test_a_device_map_strategy_captures_the_states_of_one_device(
    make_config, regen_shard, tmp_path
):
    stored = _captured(make_config, regen_shard, tmp_path, ("cpu", "auto"))
    assert len(stored["auto"]) == 12
    assert stored["auto"] == stored["cpu"]  # byte for byte


@pytest.mark.gpu
@pytest.mark.parametrize("device", ["cuda", "auto"], ids=["one-gpu", "device-map"])
def test_a_target_on_gpus_captures_the_states_the_cpu_captures(
    make_config, regen_shard, tmp_path, device
):
    """The same shard on the GPU (one device, or spread by transformers' device_map over the visible
    GPUs) stores the CPU's float32 states up to the kernels' summation order."""
    stored = _captured(make_config, regen_shard, tmp_path, ("cpu", device))
    assert stored[device].keys() == stored["cpu"].keys() and len(stored["cpu"]) == 12
    for sample, states in stored[device].items():
        for got, want in zip(states, stored["cpu"][sample], strict=True):
            got, want = (torch.frombuffer(bytearray(v), dtype=torch.float32) for v in (got, want))
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_target_offloaded_to_cpu_or_disk_is_refused_naming_the_modules(
    make_config, capture_model_dir, tmp_path
):
    from accelerate import dispatch_model
    from transformers import AutoModelForCausalLM

    config = make_config("capture.encoding=fp8_topk")
    model = AutoModelForCausalLM.from_pretrained(capture_model_dir, dtype=torch.float32).eval()
    last = config.target.num_layers - 1
    device_map = {
        "model.embed_tokens": "cpu",
        "model.rotary_emb": "cpu",
        "model.norm": "cpu",
        "lm_head": "disk",
        **{
            f"model.layers.{i}": "disk" if i == last else "cpu"
            for i in range(config.target.num_layers)
        },
    }
    model = dispatch_model(
        model, device_map, main_device="cpu", offload_dir=str(tmp_path / "offload")
    )
    with pytest.raises(
        ValueError, match=rf"offloaded 2 modules to CPU or disk \(lm_head, model.layers.{last}\)"
    ):
        HFBackend(model, config.sglang_layer_ids, hidden_size=config.target.hidden_size)
