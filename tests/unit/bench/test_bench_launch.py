"""Launch commands: generated from config, arms identical but for speculation, parsed by the servers' own parsers."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from eagle3.bench.launch import (
    SPECULATIVE_FLAGS,
    build_launch,
    split_speculative,
    without_address,
)
from eagle3.config import with_overrides

GPU_SETTINGS = [
    "server.tp=2",
    "server.mem_fraction_static=0.85",
    "server.max_running_requests=64",
    "server.cuda_graph_max_bs=32",
    "server.extra_args=[--enable-metrics]",
]


def test_arms_share_every_flag_except_the_speculative_ones(bench_config, tmp_path):
    cfg = with_overrides(bench_config, GPU_SETTINGS)
    base = build_launch(cfg, "baseline", port=31000)
    spec = build_launch(cfg, "eagle3", draft=tmp_path, port=31000)
    shared, flags = split_speculative(spec.server_args())
    assert shared == base.server_args()
    assert set(flags) == set(SPECULATIVE_FLAGS)
    assert flags["--speculative-algorithm"] == "EAGLE3"
    assert flags["--speculative-draft-model-path"] == str(tmp_path.resolve())
    assert spec.argv[:3] == ["python", "-m", "sglang.launch_server"]


def test_sglang_flags_use_the_pinned_spellings(bench_config, tmp_path):
    args = build_launch(with_overrides(bench_config, GPU_SETTINGS), "eagle3", draft=tmp_path, port=31000).argv
    for flag, value in [
        ("--tp-size", "2"),
        ("--mem-fraction-static", "0.85"),
        ("--max-running-requests", "64"),
        ("--cuda-graph-max-bs-decode", "32"),
        ("--context-length", "1024"),
        ("--speculative-num-steps", "3"),
        ("--speculative-eagle-topk", "1"),
        ("--speculative-num-draft-tokens", "4"),
    ]:
        assert args[args.index(flag) + 1] == value
    assert "--enable-metrics" in args


def test_both_arms_carry_the_same_batch_limit_by_default(bench_config, tmp_path):
    """SGLang 0.5.23 server_args.py ServerArgs._handle_speculative_decoding sets max_running_requests=48 for an
    EAGLE/EAGLE3 server when none is given; the baseline would stay uncapped, so both arms always get the flag."""
    for arm in ("baseline", "eagle3"):
        args = build_launch(bench_config, arm, draft=tmp_path, port=31000).argv
        assert args[args.index("--max-running-requests") + 1] == "48"


def test_eagle3_arm_without_a_draft_is_refused(bench_config):
    with pytest.raises(ValueError, match="--draft"):
        build_launch(bench_config, "eagle3")


def test_port_zero_picks_a_free_port(bench_config):
    cmd = build_launch(with_overrides(bench_config, ["server.port=0"]), "baseline")
    assert cmd.port > 0 and cmd.url.endswith(f":{cmd.port}")


def test_the_launcher_runs_the_command_with_this_interpreter_and_its_address_last(bench_config, tmp_path):
    cmd = build_launch(bench_config, "baseline", flavour="reference", port=31000)
    server = cmd.server(log_path=tmp_path / "s.log")
    assert server.argv[:3] == [sys.executable, "-m", "eagle3.serve"]
    assert server.argv[3:] == [*without_address(cmd.server_args()), "--host", cmd.host, "--port", "31000"]
    assert server.url == cmd.url


def test_reference_flavour_parses_with_the_reference_server_parser(bench_config, tmp_path):
    from eagle3.serve.args import parse_args

    cfg = with_overrides(bench_config, GPU_SETTINGS)
    spec = build_launch(cfg, "eagle3", flavour="reference", draft=tmp_path, port=31000)
    base = build_launch(cfg, "baseline", flavour="reference", port=31000)
    assert spec.argv[:3] == ["python", "-m", "eagle3.serve"]
    assert split_speculative(spec.server_args())[0] == base.server_args()
    args = parse_args(spec.server_args())
    assert args.speculative_algorithm == "EAGLE3"
    assert args.speculative_draft_model_path == str(tmp_path.resolve())
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (3, 1, 4)
    assert args.max_running_requests == 64 and args.context_length == 1024


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="the sglang extra is not installed")
def test_generated_command_parses_with_sglang_server_args(bench_config, tmp_path):
    from eagle3.bench.launch import parse_with_sglang

    cfg = with_overrides(bench_config, GPU_SETTINGS)
    ns = parse_with_sglang(build_launch(cfg, "eagle3", draft=tmp_path, port=31000).server_args())
    assert ns.speculative_algorithm == "EAGLE3"
    assert ns.tp_size == 2 and ns.cuda_graph_max_bs_decode == 32 and ns.speculative_num_draft_tokens == 4


def test_without_address_drops_host_and_port_only():
    assert without_address(["--model-path", "m", "--host", "h", "--port=5", "--dtype", "auto"]) == [
        "--model-path",
        "m",
        "--dtype",
        "auto",
    ]

