"""CLI: ``eagle3 launch-sglang`` prints the generated command, ``eagle3 preflight`` exits 1 naming the bad flag."""

from __future__ import annotations

from typer.testing import CliRunner

from flows.cli import app


def _config_file(config, tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(config.to_yaml())
    return str(path)


def test_launch_sglang_prints_both_arms_from_config(bench_config, make_export, tmp_path):
    cfg = _config_file(bench_config, tmp_path)
    runner = CliRunner()
    base = runner.invoke(app, ["launch-sglang", "--arm", "baseline", "--config", cfg])
    spec = runner.invoke(app, ["launch-sglang", "--arm", "eagle3", "--draft", str(make_export()), "--config", cfg])
    assert base.exit_code == 0 and spec.exit_code == 0, base.output + spec.output
    assert base.stdout.startswith("python -m sglang.launch_server --model-path")
    assert spec.stdout.startswith(base.stdout.strip())  # the speculative arm only appends its flags
    assert "--speculative-algorithm EAGLE3" in spec.stdout
    ref = runner.invoke(app, ["launch-sglang", "--arm", "baseline", "--engine", "reference", "--config", cfg])
    assert ref.stdout.startswith("python -m eagle3.serve.reference --model-path")


def test_launch_sglang_eagle3_without_any_draft_exits_2(bench_config, tmp_path):
    result = CliRunner().invoke(
        app, ["launch-sglang", "--arm", "eagle3", "--config", _config_file(bench_config, tmp_path)]
    )
    assert result.exit_code == 2


def test_preflight_cli_fails_an_eagle_launch_naming_the_flag(bench_config, make_export, tmp_path):
    cfg = _config_file(bench_config, tmp_path)
    export = str(make_export())
    ok = CliRunner().invoke(app, ["preflight", "--draft", export, "--config", cfg])
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(
        app, ["preflight", "--draft", export, "--config", cfg, "--set", "speculative.algorithm=EAGLE"]
    )
    assert bad.exit_code == 1
    assert "FAIL algorithm" in bad.output and "--speculative-algorithm is 'EAGLE'" in bad.output
