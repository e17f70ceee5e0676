"""The ``eagle3`` command's contract: one exit-code table (0 ok, 1 negative verdict, 2 bad usage/config/input), one
``error: <message>`` line on stderr and no traceback for expected failures, results on stdout whole enough to grep.

Fast on purpose: every command here fails before any stage runs, or only reads the dataset catalog.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from eagle3.config import ConfigError
from eagle3.data.catalog import entries
from eagle3.layout import StageInputError
from flows.cli import app
from flows.commands.common import EXIT_FAILED, EXIT_USAGE, EXPECTED_ERRORS, CliError, exit_code_for


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def _assert_one_error_line(result: Result, code: int = EXIT_USAGE) -> str:
    """The failure exits with ``code`` and says so in exactly one ``error:`` line on stderr, without a traceback."""
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
def test_every_entry_of_the_exit_code_table_names_an_exception_class(module: str, name: str, code: int):
    kind = getattr(importlib.import_module(module), name)
    assert issubclass(kind, Exception) and code in (EXIT_FAILED, EXIT_USAGE)


def test_an_unknown_key_in_set_exits_2_with_one_error_line():
    result = _invoke("config", "show", "--set", "trainer.lr=1")
    line = _assert_one_error_line(result)
    assert "trainer" in line and result.stdout == ""


def test_an_override_without_equals_and_a_missing_config_file_exit_2():
    assert "a.b=value" in _assert_one_error_line(_invoke("config", "show", "--set", "train.lr"))
    assert "does not exist" in _assert_one_error_line(_invoke("config", "show", "--config", "/nonexistent.yaml"))


def test_config_show_resolves_a_recipe_and_its_yaml_file_to_the_same_config(tmp_path: Path):
    from_recipe = _invoke("config", "show", "--recipe", "kimi_k2_5", "--set", "train.lr=0.5")
    assert from_recipe.exit_code == 0, from_recipe.output
    path = tmp_path / "kimi.yaml"
    path.write_text(from_recipe.stdout)
    from_file = _invoke("config", "show", "--config", str(path))
    assert from_file.exit_code == 0, from_file.output
    assert yaml.safe_load(from_file.stdout) == yaml.safe_load(from_recipe.stdout)
    assert yaml.safe_load(from_file.stdout)["train"]["lr"] == 0.5


def test_retry_shards_and_regen_status_on_a_missing_run_exit_2_in_one_line():
    for args in (["retry-shards", "--run", "/nonexistent"], ["regen", "status", "--run", "/nonexistent"]):
        result = _invoke(*args)
        assert "/nonexistent" in _assert_one_error_line(result)
        assert len(result.stderr.splitlines()) == 1, result.stderr


def test_vocab_export_and_train_agree_that_missing_input_is_exit_2(root_override: str, tmp_path: Path):
    missing = str(tmp_path / "missing")
    _assert_one_error_line(_invoke("vocab", "--features", missing, "--set", root_override))
    export = ["export", "--draft-dir", missing, "--out", str(tmp_path / "out"), "--vocab", missing]
    assert "no checkpoint" in _assert_one_error_line(_invoke(*export, "--set", root_override))
    assert "features" in _assert_one_error_line(_invoke("train", "--set", root_override))


def test_a_click_usage_error_is_also_exit_2():
    assert _invoke("vocab", "--no-such-flag").exit_code == EXIT_USAGE


def test_datasets_list_prints_every_full_name_on_stdout_one_row_per_line():
    result = _invoke("datasets", "list")
    assert result.exit_code == 0 and result.stderr == "", result.output
    rows = {line.split("\t")[0]: line for line in result.stdout.splitlines()[1:]}
    assert set(rows) == {e.name for e in entries()}
    sharegpt = [line for line in result.stdout.splitlines() if "sharegpt" in line]  # `| grep sharegpt`
    assert "anon8231489123/ShareGPT_Vicuna_unfiltered" in rows["sharegpt"] and rows["sharegpt"] in sharegpt
    assert "…" not in result.stdout


def test_datasets_list_json_is_parseable_with_typed_values():
    result = _invoke("datasets", "list", "--json")
    assert result.exit_code == 0, result.output
    listed = {row["name"]: row for row in json.loads(result.stdout)}
    assert set(listed) == {e.name for e in entries()}
    assert listed["sharegpt"]["hub_id"] == "anon8231489123/ShareGPT_Vicuna_unfiltered"
    assert isinstance(listed["sharegpt"]["rows"], int) and isinstance(listed["sharegpt"]["domains"], list)


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
