"""The ``eagle3`` command's contract: one exit-code table (0 ok, 1 negative verdict, 2 bad
usage/config/input), one ``error: <message>`` line on stderr and no traceback for expected failures,
results on stdout whole enough to grep.

Fast on purpose: every command here fails before any stage runs, or only reads the dataset catalog.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from eagle3.config.base import ConfigError
from eagle3.data.catalog import entries
from eagle3.rundir.layout import StageInputError
from flows.cli import app
from flows.commands.common import EXIT_FAILED, EXIT_USAGE, EXPECTED_ERRORS, CliError, exit_code_for


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def _assert_one_error_line(result: Result, code: int = EXIT_USAGE) -> str:
    """The failure exits with ``code`` and says so in exactly one ``error:`` line on stderr, without
    a traceback."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.startswith("error: ") and "Traceback" not in result.output
    return errors[0]


@pytest.fixture
def root_override(tmp_path: Path) -> str:
    """An empty run root, so every stage input is missing."""
    return f"root={tmp_path / 'run-root'}"


def test_the_exit_code_table_maps_input_errors_to_2_and_leaves_bugs_alone():
    assert exit_code_for(ConfigError("x")) == EXIT_USAGE
    assert exit_code_for(StageInputError("x")) == EXIT_USAGE
    assert exit_code_for(FileNotFoundError("x")) == EXIT_USAGE
    assert exit_code_for(CliError("refused", code=EXIT_FAILED)) == EXIT_FAILED
    assert exit_code_for(RuntimeError("a bug")) is None  # keeps its traceback


@pytest.mark.parametrize(("module", "name", "code"), EXPECTED_ERRORS)
def test_every_entry_of_the_exit_code_table_names_an_exception_class(
    module: str, name: str, code: int
):
    kind = getattr(importlib.import_module(module), name)
    assert issubclass(kind, Exception) and code in (EXIT_FAILED, EXIT_USAGE)


def test_an_unknown_key_in_set_exits_2_with_one_error_line():
    result = _invoke("config", "show", "--set", "trainer.lr=1")
    line = _assert_one_error_line(result)
    assert "trainer" in line and result.stdout == ""


def test_the_console_script_exits_with_the_apps_code_and_output():
    """``flows.cli.main`` (the installed ``eagle3``) wraps the app for its exit; the table and the
    streams hold."""
    command = [sys.executable, "-m", "flows.cli", "config", "show", "--recipe", "tiny"]
    shown = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).parents[2])
    refused = subprocess.run(
        [*command, "--set", "trainer.lr=1"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert shown.returncode == 0 and yaml.safe_load(shown.stdout)["name"], shown.stderr
    assert (
        refused.returncode == EXIT_USAGE
        and refused.stdout == ""
        and refused.stderr.startswith("error: ")
    )


def test_an_override_without_equals_and_a_missing_config_file_exit_2():
    assert "a.b=value" in _assert_one_error_line(_invoke("config", "show", "--set", "train.lr"))
    assert "does not exist" in _assert_one_error_line(
        _invoke("config", "show", "--config", "/nonexistent.yaml")
    )


def test_config_show_resolves_a_recipe_and_its_yaml_file_to_the_same_config(tmp_path: Path):
    from_recipe = _invoke("config", "show", "--recipe", "kimi_k2_5", "--set", "train.lr=0.5")
    assert from_recipe.exit_code == 0, from_recipe.output
    path = tmp_path / "kimi.yaml"
    path.write_text(from_recipe.stdout)
    from_file = _invoke("config", "show", "--config", str(path))
    assert from_file.exit_code == 0, from_file.output
    assert yaml.safe_load(from_file.stdout) == yaml.safe_load(from_recipe.stdout)
    assert yaml.safe_load(from_file.stdout)["train"]["lr"] == 0.5


def test_config_show_prints_the_sglang_capture_memory_plan_per_gpu():
    shown = _invoke("config", "show", "--recipe", "kimi_k2_5")
    assert shown.exit_code == 0, shown.output
    derived = yaml.safe_load(
        "\n".join(
            line.removeprefix("# ") for line in shown.stdout.split("# derived")[1].splitlines()[1:]
        )
    )
    assert derived["capture_memory_per_gpu"] == {
        "ranks": 8,
        "weights_per_gpu": "74.38 GB",
        "capture_buffers_per_gpu": "1.28 GB",
        "per_gpu": "75.65 GB",
        "weights_from": "target.checkpoint_bytes",
    }


def test_retry_shards_and_regen_status_on_a_missing_run_exit_2_in_one_line():
    for args in (
        ["retry-shards", "--run", "/nonexistent"],
        ["regen", "status", "--run", "/nonexistent"],
    ):
        result = _invoke(*args)
        assert "/nonexistent" in _assert_one_error_line(result)
        assert len(result.stderr.splitlines()) == 1, result.stderr


def test_vocab_export_and_train_agree_that_missing_input_is_exit_2(
    root_override: str, tmp_path: Path
):
    missing = str(tmp_path / "missing")
    _assert_one_error_line(_invoke("vocab", "--features", missing, "--set", root_override))
    export = ["export", "--draft-dir", missing, "--out", str(tmp_path / "out"), "--vocab", missing]
    assert "no checkpoint" in _assert_one_error_line(_invoke(*export, "--set", root_override))
    assert "features" in _assert_one_error_line(_invoke("train", "--set", root_override))


def test_data_errors_and_units_failed_on_damaged_input_exit_2_and_other_failed_units_exit_1():
    from eagle3.data.discover import DiscoveryError
    from eagle3.errors import DataError
    from eagle3.regen.shard import ShardFailed
    from eagle3.stage import UnitFailure, UnitsDamaged, UnitsFailed

    assert exit_code_for(DataError("damaged shard")) == EXIT_USAGE
    assert exit_code_for(DiscoveryError("empty file")) == EXIT_USAGE
    assert exit_code_for(UnitsFailed("train", "/run", [0], "eagle3 train")) == EXIT_FAILED
    damaged = {"0": UnitFailure(message="x.parquet: sha256 differs", damaged=True)}
    assert (
        exit_code_for(UnitsDamaged("capture", "/run", [0, 1], "eagle3 capture", causes=damaged))
        == EXIT_USAGE
    )
    assert exit_code_for(ShardFailed(0, "no server healthy for 300s")) == EXIT_FAILED


def test_a_server_that_is_not_a_url_is_refused_at_load_in_one_line():
    result = _invoke("config", "show", "--set", "regen.servers=[not a url]")
    _assert_one_error_line(result)  # "error: invalid config:" and the field's line under it
    assert "regen.servers: 'not a url' is not a server URL; write http://HOST:PORT" in result.stderr


def test_serve_with_a_missing_model_dir_exits_2_in_one_line():
    result = _invoke("serve", "--model", "/nonexistent")
    assert result.exit_code == EXIT_USAGE and "Traceback" not in result.output
    (line,) = result.output.strip().splitlines()
    assert "--model /nonexistent: no such model directory" in line


def test_serve_on_a_taken_port_is_bad_usage_exit_2_in_one_line_before_loading_anything():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _invoke(
            "serve", "--synthetic-tokens", "4", "--host", "127.0.0.1", "--port", str(port)
        )
    assert result.exit_code == EXIT_USAGE and "Traceback" not in result.output
    (line,) = result.output.strip().splitlines()
    assert (
        line.startswith("error: ")
        and f"cannot listen on 127.0.0.1:{port}" in line
        and "--port" in line
    )


def test_a_click_usage_error_is_also_exit_2():
    assert _invoke("vocab", "--no-such-flag").exit_code == EXIT_USAGE


def test_datasets_list_prints_every_full_name_on_stdout_one_row_per_line():
    result = _invoke("datasets", "list")
    assert result.exit_code == 0 and result.stderr == "", result.output
    rows = {line.split("\t")[0]: line for line in result.stdout.splitlines()[1:]}
    assert set(rows) == {e.name for e in entries()}
    # `| grep sharegpt`
    sharegpt = [line for line in result.stdout.splitlines() if "sharegpt" in line]
    assert (
        "anon8231489123/ShareGPT_Vicuna_unfiltered" in rows["sharegpt"]
        and rows["sharegpt"] in sharegpt
    )
    assert "…" not in result.stdout


def test_datasets_list_json_is_parseable_with_typed_values():
    result = _invoke("datasets", "list", "--json")
    assert result.exit_code == 0, result.output
    listed = {row["name"]: row for row in json.loads(result.stdout)}
    assert set(listed) == {e.name for e in entries()}
    assert listed["sharegpt"]["hub_id"] == "anon8231489123/ShareGPT_Vicuna_unfiltered"
    assert isinstance(listed["sharegpt"]["rows"], int) and isinstance(
        listed["sharegpt"]["domains"], list
    )


def test_watch_progress_polls_until_the_block_exits_and_once_more_after():
    import time

    from eagle3.stage import Progress
    from flows.commands.common import watch_progress

    answers = iter([None, (Progress(done=1, total=4), "")])
    calls: list[int] = []

    def poll() -> tuple[Progress, str] | None:
        calls.append(1)
        return next(answers, (Progress(done=4, total=4), "done"))

    with watch_progress("test", poll, every_s=0.01):
        while len(calls) < 3:
            time.sleep(0.01)
    settled = len(calls)
    assert settled >= 4, "the last poll after the block shows the final count"
    assert len(calls) == settled, "the watcher thread stopped with the block"


def test_a_configured_prefect_api_is_reused_and_nothing_is_started(monkeypatch: pytest.MonkeyPatch):
    import subprocess

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.commands.common import prefect_api

    monkeypatch.setattr(
        subprocess,
        "Popen",
        lambda *a, **k: pytest.fail("started a server next to a configured one"),
    )
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}), prefect_api():
        assert PREFECT_API_URL.value() == "http://127.0.0.1:9/api"


@pytest.mark.parametrize(("configured", "expected"), [(None, None), (60, 60)])
def test_flow_runs_on_a_temporary_server_send_no_heartbeats_unless_configured(
    monkeypatch: pytest.MonkeyPatch, configured, expected
):
    """Nothing watches a temporary server's heartbeats, and each flow run's end waits for Prefect's
    heartbeat thread; a configured frequency is kept, and so is Prefect's default on a reused
    server."""
    from contextlib import contextmanager, nullcontext

    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        get_current_settings,
        temporary_settings,
    )

    import flows.commands.common as common

    @contextmanager
    def started(meanwhile):
        yield "http://127.0.0.1:9/api"

    monkeypatch.setattr(common, "_temporary_server", started)
    asked = (
        temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: configured})
        if configured
        else nullcontext()
    )
    with asked, temporary_settings({PREFECT_API_URL: None}), common.prefect_api():
        assert PREFECT_API_URL.value() == "http://127.0.0.1:9/api"
        assert get_current_settings().flows.heartbeat_frequency == expected
    prefect_default = get_current_settings().flows.heartbeat_frequency
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}), common.prefect_api():
        assert get_current_settings().flows.heartbeat_frequency == prefect_default, (
            "a reused server keeps it"
        )


_HOLD_A_TEMPORARY_API = """
import time
from prefect.settings import PREFECT_API_URL
from flows.commands.common import prefect_api
with prefect_api():
    print(PREFECT_API_URL.value(), flush=True)
    time.sleep(600)
"""


def test_the_temporary_prefect_server_answers_and_dies_with_a_kill_9_of_its_command(tmp_path: Path):
    import os
    import signal
    import subprocess
    import sys
    import time

    import httpx
    import psutil

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {
        "PREFECT_HOME": str(tmp_path),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    command = subprocess.Popen(
        [sys.executable, "-c", _HOLD_A_TEMPORARY_API], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        api_url = command.stdout.readline().strip()  # printed once the server answered
        assert httpx.get(f"{api_url}/health", timeout=10).status_code == 200
        (server,) = psutil.Process(command.pid).children()
    finally:
        command.send_signal(signal.SIGKILL)
        command.wait()
    deadline = time.monotonic() + 30
    while server.is_running() and server.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, (
            f"Prefect's temporary server {server.pid} outlived its command"
        )
        time.sleep(0.2)


def test_prefect_log_lines_go_through_the_bars_console_while_it_draws():
    import io
    import logging

    from prefect.logging.handlers import PrefectConsoleHandler
    from rich.console import Console

    from flows.commands.common import prefect_logs_on

    handler, target = PrefectConsoleHandler(), Console(file=io.StringIO(), width=200)
    own = handler.console
    logger = logging.getLogger("prefect.test-bar-console")
    logger.addHandler(handler)
    try:
        with prefect_logs_on(target):
            logger.warning("a flow log line")
        assert "a flow log line" in target.file.getvalue() and handler.console is own
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--recipe", "tiny"],
        ["gate", "--recipe", "tiny", "--draft", "d"],
        ["launch-sglang", "--arm", "baseline", "--run", "--recipe", "tiny"],
    ],
)
def test_sglang_on_a_cpu_without_its_runtime_exits_2_in_one_line_before_any_work(
    command, tmp_path, monkeypatch
):
    monkeypatch.setenv("EAGLE3_SGLANG_PYTHON", str(tmp_path / "no-runtime" / "bin" / "python"))
    result = _invoke(*command, "--set", f"root={tmp_path / 'run'}", "--set", "server.engine=sglang")
    line = _assert_one_error_line(result)
    assert "bash infra/dev.sh sglang" in line and "SGLang 0.5.23" in line
    assert not (tmp_path / "run").exists()  # nothing ran


@pytest.fixture
def int4_target(tiny_world, tmp_path: Path) -> Path:
    """A checkpoint directory whose config.json says compressed-tensors, as Kimi-K2.5's INT4 one."""
    config = json.loads((tiny_world.model_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors"}
    target = tmp_path / "int4-target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(config))
    return target


# Each optional mode, the packages that make it work and the extra that installs them.
MODES = {
    "online-training": (["train.features=online"], ["ray"], "ray"),
    "auto-features": (["train.features=auto"], ["ray"], "ray"),
    "ray-task-runner": (["orchestration.task_runner=ray"], ["prefect_ray"], "ray"),
    "sglang-servers-on-gpus": (
        ["server.engine=sglang", "server.device=cuda"],
        ["sglang"],
        "sglang",
    ),
    "sglang-capture-on-gpus": (
        ["capture.backend=sglang", "capture.device=cuda"],
        ["sglang"],
        "sglang",
    ),
    "target-spread-over-gpus": (["capture.device=auto"], ["accelerate"], "multigpu"),
    "int4-target": (["target.model_path={int4}"], ["compressed_tensors"], "quantized"),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_a_night_whose_mode_lacks_its_extra_is_refused_before_any_stage_in_one_line(
    mode, hide_modules, int4_target, tmp_path, monkeypatch
):
    overrides, hidden, extra = MODES[mode]
    monkeypatch.delenv("EAGLE3_SGLANG_PYTHON", raising=False)
    hide_modules(*hidden)
    sets = [arg for o in overrides for arg in ("--set", o.format(int4=int4_target))]
    result = _invoke("run", "--recipe", "tiny", "--set", f"root={tmp_path / 'run'}", *sets)
    line = _assert_one_error_line(result)
    assert f"pip install 'eagle3-pipeline[{extra}]'" in line, line
    assert not (tmp_path / "run").exists()  # nothing ran: not even Prefect's server was started


@pytest.mark.parametrize("mode", [m for m in MODES if "sglang" not in m])  # not in this venv
def test_the_same_modes_with_their_extras_installed_are_not_refused(mode, int4_target):
    from eagle3.recipes import resolve
    from eagle3.requirements import installed, missing

    overrides, needed, _ = MODES[mode]
    if not all(installed(name) for name in needed):
        pytest.skip(f"{needed} not installed here (infra/dev.sh installs them)")
    assert missing(resolve("tiny", [o.format(int4=int4_target) for o in overrides])) == []
