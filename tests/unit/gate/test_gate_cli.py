"""CLI: ``eagle3 launch-sglang`` prints the generated command, ``eagle3 preflight`` exits 1 naming
the bad flag."""

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
    spec = runner.invoke(
        app, ["launch-sglang", "--arm", "eagle3", "--draft", str(make_export()), "--config", cfg]
    )
    assert base.exit_code == 0 and spec.exit_code == 0, base.output + spec.output
    assert base.stdout.startswith("python -m sglang.launch_server --model-path")
    assert spec.stdout.startswith(base.stdout.strip())  # the speculative arm only appends its flags
    assert "--speculative-algorithm EAGLE3" in spec.stdout
    ref = runner.invoke(
        app, ["launch-sglang", "--arm", "baseline", "--engine", "reference", "--config", cfg]
    )
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
        app,
        ["preflight", "--draft", export, "--config", cfg, "--set", "speculative.algorithm=EAGLE"],
    )
    assert bad.exit_code == 1
    assert "FAIL algorithm" in bad.output and "--speculative-algorithm is 'EAGLE'" in bad.output


def test_eval_reads_mt_benchs_own_file_and_prints_its_result_on_stdout(
    make_export, tiny_world, tmp_path
):
    """``eagle3 eval --prompts question.jsonl``: MT-bench's rows (``turns``) are prompts like any
    other set, and the result is the command's output (stdout), its progress on stderr."""
    import json

    turns = [[f"Say hello {i}.", "Again."] for i in range(2)]
    rows = [{"question_id": 81 + i, "category": "writing", "turns": t} for i, t in enumerate(turns)]
    mt_bench = tmp_path / "question.jsonl"
    mt_bench.write_text("".join(json.dumps(r) + "\n" for r in rows))
    draft = str(make_export())
    args = ["eval", "--draft", draft, "--prompts", str(mt_bench), "--max-new-tokens", "4"]
    args += ["--recipe", "tiny"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("accept length ") and "over 2 prompts" in result.stdout
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"query": "hi"}\n')
    refused = CliRunner().invoke(app, [*args[:4], str(odd), *args[5:]])  # refused before the target
    assert refused.exit_code == 2 and "row 1 has keys ['query']" in refused.output
