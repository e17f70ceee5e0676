"""``eagle3 plan``: tonight's plan printed before anything runs (library only, no Prefect)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from eagle3.scaling.selection import NIGHTS_FILE
from flows.cli import app


def test_plan_prints_the_aimed_table_and_selects_nothing(tmp_path: Path, write_prompt_pool):
    prompts = write_prompt_pool(tmp_path / "prompts" / "p", {"chat": 40, "math": 20})
    args = [
        "plan",
        "--scale",
        "30",
        "--prompts",
        str(prompts),
        "--set",
        f"root={tmp_path / 'run'}",
        "--set",
        "scaling.policy=aimed",
        "--set",
        "scaling.eval_per_domain=2",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (
        "| domain | pool left | current accept | traffic share | allocation | bound by | why |"
        in result.stdout
    )
    assert "| chat | 38 | - | 0.50 | 15 rows |" in result.stdout
    assert "| math | 18 | - | 0.50 | 15 rows |" in result.stdout
    assert not list((tmp_path / "run").rglob(NIGHTS_FILE)), "planning selected rows"


def test_plan_without_a_prompts_stage_exits_2_in_one_line(tmp_path: Path):
    result = CliRunner().invoke(app, ["plan", "--set", f"root={tmp_path / 'run'}", "--scale", "10"])
    assert result.exit_code == 2, result.output
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")], result.stderr
    assert "eagle3 normalize" in result.stderr and "Traceback" not in result.output
