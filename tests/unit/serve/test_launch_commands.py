"""Launch commands: generated from config, arms identical but for speculation, parsed by the
servers' own parsers."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3.config.pipeline import with_overrides
from eagle3.gate.recommend import serving_config
from eagle3.gate.serving import StepResult, adaptive_tiers
from eagle3.recipes import load_recipe
from eagle3.serve.launch_commands import (
    ADAPTIVE_FLAGS,
    CPU_ENV,
    CPU_FLAGS,
    CPU_LAUNCHER,
    SPECULATIVE_FLAGS,
    EngineUnavailable,
    build_launch,
    check_sglang_runtime,
    split_speculative,
    without_address,
)

REPO = Path(__file__).resolve().parents[3]

GPU_SETTINGS = [
    "server.tp=2",
    "server.mem_fraction_static=0.85",
    "server.max_running_requests=64",
    "server.cuda_graph_max_bs=32",
    "server.extra_args=[--enable-metrics]",
]


def test_arms_share_every_flag_except_the_speculative_ones(launch_config, tmp_path):
    cfg = with_overrides(launch_config, GPU_SETTINGS)
    base = build_launch(cfg, "baseline", port=31000)
    spec = build_launch(cfg, "eagle3", draft=tmp_path, port=31000)
    shared, flags = split_speculative(spec.server_args())
    assert shared == base.server_args()
    assert set(flags) == set(SPECULATIVE_FLAGS)
    assert flags["--speculative-algorithm"] == "EAGLE3"
    assert flags["--speculative-draft-model-path"] == str(tmp_path.resolve())
    assert spec.argv[:3] == ["python", "-m", "sglang.launch_server"]


def test_sglang_flags_use_the_pinned_spellings(launch_config, tmp_path):
    args = build_launch(
        with_overrides(launch_config, GPU_SETTINGS), "eagle3", draft=tmp_path, port=31000
    ).argv
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


def test_both_arms_carry_the_same_batch_limit_by_default(launch_config, tmp_path):
    """SGLang 0.5.23 server_args.py ServerArgs._handle_speculative_decoding sets
    max_running_requests=48 for an EAGLE/EAGLE3 server when none is given; the baseline would stay
    uncapped, so both arms always get the flag."""
    for arm in ("baseline", "eagle3"):
        args = build_launch(launch_config, arm, draft=tmp_path, port=31000).argv
        assert args[args.index("--max-running-requests") + 1] == "48"


def test_eagle3_arm_without_a_draft_is_refused(launch_config):
    with pytest.raises(ValueError, match="--draft"):
        build_launch(launch_config, "eagle3")


def test_port_zero_picks_a_free_port(launch_config):
    cmd = build_launch(with_overrides(launch_config, ["server.port=0"]), "baseline")
    assert cmd.port > 0 and cmd.url.endswith(f":{cmd.port}")


def test_the_launcher_runs_the_command_with_this_interpreter_and_its_address_last(
    launch_config, tmp_path
):
    cmd = build_launch(launch_config, "baseline", engine="reference", port=31000)
    server = cmd.server(log_path=tmp_path / "s.log")
    assert server.argv[:3] == [sys.executable, "-m", "eagle3.serve.reference"]
    assert server.argv[3:] == [
        *without_address(cmd.server_args()),
        "--host",
        cmd.host,
        "--port",
        "31000",
    ]
    assert server.url == cmd.url


def test_reference_engine_parses_with_the_reference_server_parser(launch_config, tmp_path):
    from eagle3.serve.reference.args import parse_args

    cfg = with_overrides(launch_config, GPU_SETTINGS)
    spec = build_launch(cfg, "eagle3", engine="reference", draft=tmp_path, port=31000)
    base = build_launch(cfg, "baseline", engine="reference", port=31000)
    assert spec.argv[:3] == ["python", "-m", "eagle3.serve.reference"]
    assert split_speculative(spec.server_args())[0] == base.server_args()
    args = parse_args(spec.server_args())
    assert args.speculative_algorithm == "EAGLE3"
    assert args.speculative_draft_model_path == str(tmp_path.resolve())
    assert (
        args.speculative_num_steps,
        args.speculative_eagle_topk,
        args.speculative_num_draft_tokens,
    ) == (3, 1, 4)
    assert args.max_running_requests == 64 and args.context_length == 1024


def test_adaptive_speculation_appends_sglangs_switch_and_file_to_the_speculative_flags(
    launch_config, tmp_path
):
    spec = build_launch(
        launch_config, "eagle3", draft=tmp_path, port=31000, adaptive_config=tmp_path / "a.json"
    )
    shared, flags = split_speculative(spec.server_args())
    assert shared == build_launch(launch_config, "baseline", port=31000).server_args()
    assert flags[ADAPTIVE_FLAGS[0]] == "" and flags[ADAPTIVE_FLAGS[1]] == str(
        (tmp_path / "a.json").resolve()
    )
    assert set(flags) == {*SPECULATIVE_FLAGS, *ADAPTIVE_FLAGS}
    with pytest.raises(ValueError, match=r"adaptive speculation.*SGLang's"):
        build_launch(
            launch_config,
            "eagle3",
            engine="reference",
            draft=tmp_path,
            adaptive_config=tmp_path / "a.json",
        )


def test_a_speculative_switch_takes_no_value_wherever_it_stands():
    args = [
        "--speculative-adaptive",
        "--speculative-num-steps",
        "3",
        "--dtype",
        "auto",
        "--speculative-adaptive",
    ]
    assert split_speculative(args) == (
        ["--dtype", "auto"],
        {"--speculative-adaptive": "", "--speculative-num-steps": "3"},
    )


PARSE = (
    "import json, sys\n"
    "from eagle3.serve.sglang_cpu.launch import parse\n"
    "from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams\n"
    "job = json.loads(sys.argv[1])\n"
    "routes = [[AdaptiveSpeculativeParams(steps, path).get_steps_for_batch(b) for b in sizes]\n"
    "          for steps, path, sizes in job['adaptive']]\n"
    "print(json.dumps({'parsed': [vars(parse(a)) for a in job['arms']], 'routes': routes}, default=str))"
)


RECIPES = ("tiny", "llama3_8b", "kimi_k2_5", "glm_5")
# The case: pays at 1, a win within noise at 4, loses at 16; a second sweep setting pays
# more at 1.
MEASURED = {
    1: [StepResult(3, 1.4, [1.3, 1.5]), StepResult(5, 1.5, [1.4, 1.6])],
    4: [StepResult(3, 1.05, [0.95, 1.15])],
    16: [StepResult(3, 0.6, [0.5, 0.7])],
}


def _server_args(shell: str) -> list[str]:
    """The arguments after ``python -m <module>`` of a printed command (environment assignments
    first)."""
    tokens = shlex.split(shell)
    return tokens[tokens.index("-m") + 2 :]


@pytest.fixture(scope="module")
def parsed_by_sglang(tmp_path_factory, sglang_python) -> dict[str, dict]:
    """Both arms and the gate's recommended (adaptive) command of every recipe (on SGLang: the tiny
    one with the CPU flags) parsed by SGLang 0.5.23's own ``ServerArgs.add_cli_args`` in the SGLang
    runtime, and the adaptive config loaded by SGLang's ``AdaptiveSpeculativeParams``, which names
    the steps it runs at each tier's first batch size (one child process: the import takes seconds):
    recipe -> baseline, speculative and adaptive namespaces, the configured max running requests,
    the steps SGLang routes and the tiers."""
    root = tmp_path_factory.mktemp("recipes")
    configs = {name: load_recipe(name, [f"root={root}"]) for name in RECIPES}
    tiers = adaptive_tiers(MEASURED)
    recommended = {
        name: serving_config(cfg, str(root), tiers, tmp_path_factory.mktemp(name))
        for name, cfg in configs.items()
    }
    arms = [
        args
        for name, cfg in configs.items()
        for args in (
            build_launch(cfg, "baseline", engine="sglang", port=31000).server_args(),
            build_launch(cfg, "eagle3", engine="sglang", draft=root, port=31000).server_args(),
            _server_args(recommended[name]["launch_sglang"]),
        )
    ]
    adaptive = [
        [
            int(a[a.index("--speculative-num-steps") + 1]),
            r["config_path"],
            [t.batch_size for t in tiers],
        ]
        for a, r in zip(arms[2::3], recommended.values(), strict=True)
    ]
    job = json.dumps({"arms": arms, "adaptive": adaptive})
    done = subprocess.run(
        [str(sglang_python), "-c", PARSE, job],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    parsed = out["parsed"]
    return {
        name: {
            "base": parsed[3 * i],
            "spec": parsed[3 * i + 1],
            "adaptive": parsed[3 * i + 2],
            "max_running": cfg.server.max_running_requests,
            "routes": out["routes"][i],
            "tiers": tiers,
            "config_path": recommended[name]["config_path"],
        }
        for i, (name, cfg) in enumerate(configs.items())
    }


@pytest.mark.sglang
@pytest.mark.parametrize("recipe", RECIPES)
def test_both_arms_of_every_recipe_parse_with_sglang_and_share_every_other_argument(
    recipe, parsed_by_sglang
):
    """SGLang 0.5.23's parser (python/sglang/srt/server_args.py) accepts both generated arms, and
    they agree on every non-speculative argument, ``--max-running-requests`` included (SGLang caps
    only a speculative server at 48 when it is unset, ``ServerArgs._handle_speculative_decoding``,
    so the comparison would not be fair)."""
    base, spec, max_running = (parsed_by_sglang[recipe][k] for k in ("base", "spec", "max_running"))
    assert spec["speculative_algorithm"] == "EAGLE3" and base["speculative_algorithm"] is None
    assert spec["max_running_requests"] == base["max_running_requests"] == max_running
    differ = {k for k in base if base[k] != spec[k]}
    assert differ <= {k for k in spec if k.startswith("speculative_")}, differ


@pytest.mark.sglang
@pytest.mark.parametrize("recipe", RECIPES)
def test_the_recommended_adaptive_command_parses_with_sglang_and_routes_each_tier_to_its_steps(
    recipe, parsed_by_sglang
):
    """The gate's recommended command (``eagle3.gate.recommend.serving_config``) parses in SGLang
    0.5.23 with adaptive speculation on and the written config, differs from the baseline only in
    speculation, and SGLang's own ``AdaptiveSpeculativeParams``
    (srt/speculative/adaptive_spec_params.py) reads the config and runs, at each tier's first batch
    size, the tier's largest step count (its only one, or the one kept until drafts stop being
    accepted; 0 where speculation lost)."""
    got = parsed_by_sglang[recipe]
    base, adaptive, tiers = got["base"], got["adaptive"], got["tiers"]
    assert adaptive["speculative_adaptive"] is True and adaptive[
        "speculative_adaptive_config"
    ] == str(Path(got["config_path"]).resolve())
    # batch 1's best
    assert (adaptive["speculative_num_steps"], adaptive["speculative_eagle_topk"]) == (5, 1)
    # the recommendation names the served port
    differ = {k for k in base if base[k] != adaptive[k]} - {"port"}
    assert differ <= {k for k in adaptive if k.startswith("speculative_")}, differ
    assert [t.candidate_steps for t in tiers] == [[5], [0, 3], [0]]
    assert got["routes"] == [max(t.candidate_steps) for t in tiers] == [5, 3, 0]


def test_without_address_drops_host_and_port_only():
    assert without_address(["--model-path", "m", "--host", "h", "--port=5", "--dtype", "auto"]) == [
        "--model-path",
        "m",
        "--dtype",
        "auto",
    ]


def test_sglang_on_a_cpu_runs_the_projects_launcher_in_its_runtime_with_only_the_cpu_flags(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("EAGLE3_SGLANG_PYTHON", str(tmp_path / "rt" / "bin" / "python"))
    tiny = load_recipe("tiny", [f"root={tmp_path}", "server.engine=sglang"])
    cpu = build_launch(tiny, "eagle3", draft=tmp_path, port=31000)
    gpu = build_launch(
        with_overrides(tiny, ["server.device=cuda"]), "eagle3", draft=tmp_path, port=31000
    )
    assert cpu.argv[:3] == [str(tmp_path / "rt" / "bin" / "python"), "-m", CPU_LAUNCHER]
    assert gpu.argv[:3] == ["python", "-m", "sglang.launch_server"] and gpu.env == {}
    assert cpu.server_args() == [
        *gpu.server_args()[: gpu.server_args().index("--host")],
        *CPU_FLAGS,
        *gpu.server_args()[gpu.server_args().index("--host") :],
    ]
    assert cpu.env == CPU_ENV and cpu.shell().startswith(
        "SGLANG_USE_CPU_ENGINE=1 OMP_NUM_THREADS=1 "
    )


def test_a_missing_or_wrong_sglang_runtime_is_one_line_saying_how_to_install_it(tmp_path):
    with pytest.raises(EngineUnavailable, match=r"not found at .*infra/dev.sh sglang") as missing:
        check_sglang_runtime(tmp_path / "nowhere" / "python")
    assert "\n" not in str(missing.value)
    with pytest.raises(
        EngineUnavailable,
        match=r"has no SGLang, the CPU runtime needs SGLang 0.5.23: .*dev.sh sglang",
    ):
        check_sglang_runtime(Path(sys.executable))  # the project's venv: no SGLang in it


def test_both_engines_serve_the_targets_dtype_never_sglangs_auto(tmp_path):
    """``server.dtype=auto`` (the default) means the target's dtype on both engines: SGLang's own
    ``auto`` would serve a float32 checkpoint in float16 while the reference server computes in
    float32."""
    smollm2 = load_recipe("smollm2", [f"root={tmp_path}"])
    for engine in ("sglang", "reference"):
        args = build_launch(smollm2, "baseline", engine=engine, port=31000).server_args()
        assert args[args.index("--dtype") + 1] == "float32", engine
    pinned = with_overrides(smollm2, ["server.dtype=bfloat16"])
    args = build_launch(pinned, "baseline", engine="sglang", port=31000).server_args()
    assert args[args.index("--dtype") + 1] == "bfloat16"
