"""``capture.backend=sglang`` on SGLang 0.5.23 itself (this CPU's runtime, ``infra/dev.sh sglang``):
the tiny world's features equal the ``hf`` backend's token by token within a stated fp32 tolerance,
with the same schema; two tensor-parallel ranks give the same states and the same full-vocab top-k
(merged over the vocab shards); a capture killed with ``kill -9`` resumes to the same shard, its
workers gone with it; a damaged regen shard is refused before any worker starts, as with ``hf``; the
large recipes' capture flags (tp 8, expert parallel) are read by SGLang's own parser.

The tolerance. Both engines compute in float32 on the same weights; they differ in kernels (SGLang's
fused RMSNorm with its residual, rotary embedding and attention over unpadded, packed requests vs
transformers' padded batch), so the states agree to float32 rounding accumulated over 8 layers:
measured max |sglang - hf| 1.0e-6 on the aux states and 3.3e-6 on the final state (values up to ~5),
2.5e-6 on the top-k probabilities. The tests allow 1e-4.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pyarrow.parquet as pq
import pytest
import torch

from eagle3.capture.backends import TopK
from eagle3.capture.schema import footer_codecs
from eagle3.capture.sglang.backend import SGLangBackend, worker_args
from eagle3.capture.shard import capture_shard, output_paths, plan_batches, read_regen_shard
from eagle3.capture.stage import CaptureStage
from eagle3.data.parquet import shard_metadata
from eagle3.recipes import load_recipe
from eagle3.rundir.runroot import FileEntry, Manifest
from eagle3.stage import UnitsFailed, run_stage

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

ATOL = 1e-4  # float32 tolerance on every state and probability (module docstring: 3.3e-6 measured)
SAMPLES_BEFORE_KILL = 2  # batches written before the child kills itself


@pytest.fixture(scope="module")
def sglang_backend(sglang_python, capture_model_dir, tmp_path_factory):
    """The tiny target in SGLang's model runner, one rank, float32 states (shared by the module's
    tests), its request pool held to 3 so that larger batches are forwarded in slices. One torch
    thread, as ``hf_backend``: the worker takes this process's thread count, and the kill test's
    child must start its worker with the same one."""
    torch.set_num_threads(1)
    backend = SGLangBackend(
        _config(
            capture_model_dir,
            tmp_path_factory.mktemp("sglang"),
            "capture.sglang.extra_args=[--max-running-requests, '3']",
        )
    )
    yield backend
    backend.close()


def _config(model_dir, root, *overrides: str):
    from transformers import AutoConfig

    from eagle3.config.pipeline import PipelineConfig, with_overrides
    from eagle3.config.target import TargetConfig

    hf = AutoConfig.from_pretrained(model_dir)
    base = PipelineConfig(
        name="sglang-capture",
        root=str(root),
        target=TargetConfig(
            model_path=str(model_dir),
            num_layers=hf.num_hidden_layers,
            hidden_size=hf.hidden_size,
            vocab_size=hf.vocab_size,
            dtype="float32",
        ),
    )
    return with_overrides(
        base,
        [
            "capture.backend=sglang",
            "capture.dtype=float32",
            "capture.batch_tokens=512",
            "capture.max_seq_len=1024",
            "capture.row_group_bytes=262144",
            *overrides,
        ],
    )


def _states(path) -> tuple[list[dict], list[tuple[torch.Tensor, torch.Tensor]]]:
    """A feature shard's rows (without states) and each row's decoded (aux, last)."""
    table = pq.read_table(path)
    aux_codec, last_codec = footer_codecs(shard_metadata(path))
    aux = [a for a, _ in aux_codec.views(table.column("aux_hidden"))]
    last = [s for s, _ in last_codec.views(table.column("last_hidden"))]
    return table.drop_columns(["aux_hidden", "last_hidden"]).to_pylist(), list(
        zip(aux, last, strict=True)
    )


def test_sglang_features_equal_hf_features_token_by_token_within_fp32_tolerance(
    sglang_backend, hf_backend, regen_shard, make_config, tmp_path
):
    # the hf fixture's layers: SGLang's default for 8 layers
    config = make_config("capture.aux_layers=[2,4,5]")
    hf = capture_shard(config, regen_shard, tmp_path / "hf" / "fp", backend=hf_backend)
    ours = capture_shard(
        sglang_backend.config, regen_shard, tmp_path / "sglang" / "fp", backend=sglang_backend
    )
    assert (
        pq.read_schema(ours["path"]).remove_metadata()
        == pq.read_schema(hf["path"]).remove_metadata()
    )
    footer = shard_metadata(ours["path"])
    assert (
        footer["capture_backend"] == "sglang"
        and shard_metadata(hf["path"])["capture_backend"] == "hf"
    )
    assert {
        k: v for k, v in footer.items() if k not in ("capture_backend", "features_fingerprint")
    } == {
        k: v
        for k, v in shard_metadata(hf["path"]).items()
        if k not in ("capture_backend", "features_fingerprint")
    }
    lengths = [len(s.input_ids) for s in read_regen_shard(regen_shard)]
    sizes = [len(b) for b in plan_batches(lengths, config.capture.batch_tokens)]
    assert sglang_backend.facts["max_requests"] == 3 and max(sizes) > 3, (
        "a batch forwarded in slices"
    )
    rows, states = _states(ours["path"])
    hf_rows, hf_states = _states(hf["path"])
    assert rows == hf_rows and len(rows) == 12
    for (aux, last), (hf_aux, hf_last) in zip(states, hf_states, strict=True):
        assert aux.shape == hf_aux.shape and last.shape == hf_last.shape
        assert (aux - hf_aux).abs().amax(dim=-1).max() <= ATOL  # every token's aux row
        assert (last - hf_last).abs().amax(dim=-1).max() <= ATOL


def test_two_tensor_parallel_ranks_give_the_same_states_and_the_full_vocab_top_k(
    sglang_python, capture_model_dir, hf_backend, tmp_path
):
    """The top-k is merged from each rank's vocab shard (worker.Runner._topk): the union of the
    shards' top-k holds the global top-k, and the log-sum-exp over both shards makes its
    probabilities full-vocab ones."""
    from eagle3.capture.head import target_topk

    backend = SGLangBackend(
        _config(
            capture_model_dir,
            tmp_path,
            "capture.sglang.tp=2",
            "capture.encoding=fp8_topk",
            "capture.topk=16",
        )
    )
    batch = [list(range(5, 60)), [7, 8, 9], list(range(300, 420))]
    try:
        out = list(backend.forward(batch))
    finally:
        backend.close()
    for (aux, final), (hf_aux, hf_last) in zip(out, hf_backend.forward(batch), strict=True):
        ids, probs = target_topk(hf_last, hf_backend.lm_head, 16)
        assert isinstance(final, TopK) and (aux - hf_aux).abs().max() <= ATOL
        assert torch.equal(final.ids.long(), ids) and (final.probs - probs).abs().max() <= ATOL


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import torch
    from eagle3.capture.shard import capture_shard
    from eagle3.config.pipeline import load_yaml

    def kill_after(done, total, tokens, calls=[0]):
        calls[0] += 1
        if calls[0] == int(sys.argv[4]):
            os.kill(os.getpid(), signal.SIGKILL)

    torch.set_num_threads(int(sys.argv[5]))  # the worker's thread count, as the resuming process's worker has it
    capture_shard(load_yaml(Path(sys.argv[1])), Path(sys.argv[2]), Path(sys.argv[3]), progress=kill_after)
    """
)


def _workers_of(pid: int) -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if any(f"eagle3-capture-{pid}-" in a for a in p.info["cmdline"] or [])
    ]


def test_kill_9_mid_capture_then_resume_writes_the_same_shard_and_leaves_no_worker(
    sglang_backend, regen_shard, tmp_path
):
    config = sglang_backend.config.model_copy(
        update={"capture": sglang_backend.config.capture.model_copy(update={"batch_tokens": 300})}
    )
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    killed = tmp_path / "killed" / "fp"
    # The killed run's worker takes this process's torch threads, as the resuming one does: bit for
    # bit needs both.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _CHILD,
            str(tmp_path / "config.yaml"),
            str(regen_shard),
            str(killed),
            str(SAMPLES_BEFORE_KILL),
            str(torch.get_num_threads()),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = child.communicate(timeout=900)
    assert child.returncode == -signal.SIGKILL, err[-3000:]
    deadline = time.monotonic() + 120
    while _workers_of(child.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _workers_of(child.pid) == [], "the killed capture's SGLang worker outlived it"
    shard, _, parts = output_paths(killed, 3)
    assert (
        not shard.exists()
        and len(list(parts.glob("shard-*.part-*.parquet"))) == SAMPLES_BEFORE_KILL
    )

    resumed = capture_shard(config, regen_shard, killed, backend=sglang_backend)
    whole = capture_shard(config, regen_shard, tmp_path / "whole" / "fp", backend=sglang_backend)
    assert resumed["rows"] == whole["rows"] == len(read_regen_shard(regen_shard))
    # bit for bit: the same batches
    assert pq.read_table(resumed["path"]).equals(pq.read_table(whole["path"]))
    assert not parts.exists()


def test_a_damaged_regen_shard_is_refused_before_any_sglang_worker_starts(
    write_regen_stage, capture_model_dir, tmp_path, monkeypatch
):
    def never(*_args, **_kwargs):
        raise AssertionError("an SGLang worker was started")

    monkeypatch.setattr(SGLangBackend, "_start", never)
    config = _config(capture_model_dir, tmp_path / "root")
    regen = write_regen_stage(config.root_path / "regen" / "fp-regen", shards=1, rows=4)
    shard = regen / "shard-00000.parquet"
    Manifest(
        stage="regen", fingerprint=regen.name, files=[FileEntry.of(shard, rows=4, base=regen)]
    ).write(regen)
    data = bytearray(shard.read_bytes())
    data[8:16] = b"\xff" * 8  # inside the first column chunk: the footer still reads
    shard.write_bytes(bytes(data))
    with pytest.raises(UnitsFailed, match=r"shard-00000\.parquet: sha256 differs.*eagle3 regen"):
        run_stage(CaptureStage(), config, regen_dir=regen)


PARSE = (
    "import json, sys\n"
    "from eagle3.serve.sglang_cpu.launch import parse\n"
    "print(json.dumps([vars(parse(a)) for a in json.loads(sys.argv[1])], default=str))"
)


def test_the_large_recipes_capture_flags_parse_with_sglang_as_tp_8_expert_parallel_and_forced_quantization(
    sglang_python, tmp_path
):
    """What cannot run here (tp 8, expert parallel, INT4/NVFP4 kernels) is at least the
    configuration SGLang 0.5.23's own parser reads: its capture-only EAGLE-3 mode with the draft's
    ids, the ranks, and no forced quantization unless asked (the checkpoint's own is served)."""
    variants = {
        "kimi_k2_5": [],
        "glm_5": [],
        "kimi_k2_5 ep": ["capture.sglang.ep=8"],
        "glm_5 fp8": ["capture.sglang.quantization=fp8"],
    }
    configs = {
        name: load_recipe(name.split()[0], [f"root={tmp_path}", *o]) for name, o in variants.items()
    }
    args = [worker_args(config, nccl_port=29500) for config in configs.values()]
    done = subprocess.run(
        [str(sglang_python), "-c", PARSE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = dict(zip(variants, json.loads(done.stdout.strip().splitlines()[-1]), strict=True))
    for name, config in configs.items():
        flags = parsed[name]
        assert (
            flags["tp_size"],
            flags["enable_return_aux_hidden_states"],
            flags["speculative_algorithm"],
        ) == (8, True, "EAGLE3")
        assert flags["return_aux_hidden_state_layer_ids"] == config.export_layer_ids
        assert flags["model_path"] == config.target.model_path and flags["dtype"] == "bfloat16"
    assert parsed["kimi_k2_5"]["trust_remote_code"] and parsed["kimi_k2_5 ep"]["ep_size"] == 8
    assert (
        parsed["kimi_k2_5"]["quantization"] is None and parsed["glm_5 fp8"]["quantization"] == "fp8"
    )


def test_a_target_sglang_refuses_to_load_names_the_config_key_and_quotes_the_ranks_log(
    sglang_python, capture_model_dir, tmp_path
):
    """The tiny target has 2048 positions; capture.max_seq_len=4096 becomes SGLang's
    --context-length, which SGLang refuses while loading: the error is SGLang's own, with where the
    flag came from and the rank's log."""
    from eagle3.capture.sglang.backend import CaptureWorkerError

    with pytest.raises(
        CaptureWorkerError,
        match=r"(?s)rank 0 could not load the target .*--context-length is "
        r"capture\.max_seq_len.*context_length \(4096\) is greater than the "
        r"derived context_length \(2048\).*rank-0\.log ends:\n",
    ):
        SGLangBackend(_config(capture_model_dir, tmp_path, "capture.max_seq_len=4096"))
