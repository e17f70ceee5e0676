"""The SGLang capture backend's wire and set-up, without SGLang: a batch file's tensors come back as
views of one mapping whose file is already gone, control lines honour their deadline and a closed
pipe, the workers get the flags a server of the target takes, and capture refuses before loading
what its GPUs cannot hold."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from eagle3.capture.footprint import CaptureMemoryError, check_served_fits, served_plan
from eagle3.capture.sglang.backend import sweep_stale_dirs, worker_args, worker_env
from eagle3.capture.sglang.channel import (
    ChannelClosed,
    LineReader,
    read_tensors,
    send,
    write_tensors,
)
from eagle3.capture.shard import features_fingerprint
from eagle3.config.base import ConfigError
from eagle3.recipes import load_recipe


def test_batch_tensors_come_back_equal_as_views_of_a_file_already_unlinked(tmp_path):
    tensors = {
        "aux": torch.randn(7, 12).bfloat16(),
        "ids": torch.arange(21, dtype=torch.int32).view(7, 3),
        "probs": torch.rand(7, 3),
        "last": torch.randn(7, 4, dtype=torch.float64),
    }
    path = tmp_path / "batch-00000001.bin"
    layout = write_tensors(path, tensors)
    assert all(entry["offset"] % 64 == 0 for entry in layout)
    back = read_tensors(path, layout)
    assert not path.exists() and not list(tmp_path.iterdir()), (
        "the reader unlinks the file it mapped"
    )
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)
    rows = back["aux"].split([3, 4])
    del back
    assert torch.equal(rows[1], tensors["aux"][3:]), "a view keeps the mapping alive"


def test_a_control_line_honours_its_deadline_and_a_closed_pipe(tmp_path):
    read_fd, write_fd = os.pipe()
    reader, writer = LineReader(read_fd), os.fdopen(write_fd, "w")
    with pytest.raises(TimeoutError):
        reader.read(0.2)
    send(writer, {"done": 1})
    send(writer, {"done": 2})
    assert reader.read(5) == {"done": 1} and reader.read(5) == {"done": 2}
    threading.Timer(0.2, writer.close).start()
    with pytest.raises(ChannelClosed):
        reader.read(30)
    with pytest.raises(ChannelClosed):
        reader.read(30, alive=lambda: False)
    os.close(read_fd)


def test_batch_directories_of_dead_capture_processes_are_swept(tmp_path):
    # above the largest pid Linux hands out by default
    dead = tmp_path / f"eagle3-capture-{2**22 + 12345}-1"
    mine = tmp_path / f"eagle3-capture-{os.getpid()}-2"
    for directory in (dead, mine):
        directory.mkdir()
        (directory / "batch-00000001.bin").write_bytes(b"x")
    sweep_stale_dirs(tmp_path)
    assert not dead.exists() and mine.exists()


def test_kimi_workers_get_its_served_flags_and_the_drafts_layer_ids():
    config = load_recipe("kimi_k2_5")
    args = worker_args(config, nccl_port=29500)
    assert args[args.index("--tp-size") + 1] == "8" and "--trust-remote-code" in args
    ids = args[args.index("--return-aux-hidden-state-layer-ids") + 1 :][:3]
    # SGLang's DeepSeek rule adds 1
    assert ids == ["1", "29", "57"] and config.sglang_layer_ids == [2, 30, 58]
    assert "--quantization" not in args, (
        "the INT4 checkpoint is served as it declares itself, kept packed"
    )
    assert "--disable-cuda-graph" in args and "--device" not in args


def test_cpu_workers_get_the_cpu_flags_a_pool_for_the_largest_batch_and_one_core_set_per_rank(
    tiny_config,
):
    from eagle3.config.pipeline import with_overrides

    config = with_overrides(
        tiny_config,
        [
            "capture.backend=sglang",
            "capture.sglang.tp=2",
            "capture.batch_tokens=900",
            "capture.max_seq_len=1000",
        ],
    )
    args = worker_args(config, nccl_port=29500)
    assert (
        args[args.index("--max-total-tokens") + 1] == "1000"
        and args[args.index("--device") + 1] == "cpu"
    )
    env = worker_env(config)
    assert (
        env["SGLANG_USE_CPU_ENGINE"] == "1"
        and len(env["SGLANG_CPU_OMP_THREADS_BIND"].split("|")) == 2
    )


def test_a_sglang_capture_needs_one_gpu_per_rank_and_a_single_device_name():
    with pytest.raises(ConfigError, match=r"set capture.gpus=8"):
        load_recipe("kimi_k2_5", ["capture.gpus=4"])
    with pytest.raises(
        ConfigError, match=r"capture.device='auto' with capture.backend=sglang: set capture.device"
    ):
        load_recipe("kimi_k2_5", ["capture.device=auto"])
    with pytest.raises(ConfigError, match=r"capture.sglang.ep=3 does not divide the 8"):
        load_recipe("kimi_k2_5", ["capture.sglang.ep=3"])


def test_the_backend_is_part_of_the_features_fingerprint_and_hf_keeps_its_own(tiny_config):
    from eagle3.config.pipeline import with_overrides

    hf = features_fingerprint(tiny_config, "regen-fp")
    sglang = features_fingerprint(
        with_overrides(tiny_config, ["capture.backend=sglang"]), "regen-fp"
    )
    tp2 = features_fingerprint(
        with_overrides(tiny_config, ["capture.backend=sglang", "capture.sglang.tp=2"]), "regen-fp"
    )
    fp8 = features_fingerprint(
        with_overrides(tiny_config, ["capture.backend=sglang", "capture.sglang.quantization=fp8"]),
        "regen-fp",
    )
    assert hf != sglang == tp2 != fp8, (
        "another engine or quantization is another stage; another split is not"
    )


def test_kimi_memory_plan_keeps_the_int4_weights_packed_and_refuses_with_both_numbers():
    # offline: the recipe's published size stands in for the headers
    config = load_recipe("kimi_k2_5")
    plan = served_plan(config)
    assert plan.ranks == 8 and plan.source == "target.checkpoint_bytes"
    assert plan.weights == -(-config.target.checkpoint_bytes // 8)
    assert 70e9 < plan.per_rank < 100e9, (
        "~0.6 TB over 8 H200s, not the ~2.1 TB transformers decompresses to"
    )
    check_served_fits(plan, 141 * 10**9, config=config)
    with pytest.raises(
        CaptureMemoryError,
        match=r"capture refused before loading moonshotai/Kimi-K2\.5: .* over 8 "
        r"tensor-parallel rank\(s\) .* 75\.65 GB per GPU, but 40\.00 GB is free",
    ):
        check_served_fits(plan, 40 * 10**9, config=config)


def test_an_unreachable_hub_falls_back_to_the_recipes_published_size(monkeypatch):
    import httpx
    import huggingface_hub

    # what an online-mode lookup raises with no network: not an OSError
    def unreachable(*args, **kwargs):
        raise httpx.ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", unreachable)
    plan = served_plan(load_recipe("kimi_k2_5"))
    assert plan.ranks == 8 and plan.source == "target.checkpoint_bytes"


def test_a_sglang_capture_that_cannot_fit_is_refused_before_any_worker_starts(
    tiny_config, monkeypatch
):
    from eagle3.capture.sglang.backend import SGLangBackend
    from eagle3.config.pipeline import with_overrides

    def never(*_args, **_kwargs):
        raise AssertionError("an SGLang worker was started")

    monkeypatch.setattr(SGLangBackend, "_start", never)
    config = with_overrides(
        tiny_config, ["capture.backend=sglang", "capture.batch_tokens=1000000000"]
    )
    with pytest.raises(
        CaptureMemoryError,
        match=r"as SGLang serves it, its weights take .* over 1 tensor-parallel "
        r"rank\(s\) \(checkpoint headers\), plus 2\.05 TB of capture buffers",
    ):
        SGLangBackend(config)
