"""`eagle3 run --recipe smollm2`, made small: a real target (SmolLM2-135M-Instruct) regenerating
real data (ShareGPT as the registry ships it) and gated on MT-bench's own file, through every stage
on the reference server; then the night's draft in front of real SGLang 0.5.23 (its preflight:
SGLang loads and serves it).

A handful of conversations and short answers: the draft learns little, so the gate's verdict is
whatever this machine measures (0, 1 or 3). What is checked is that nothing in the chain needs an
override a user would have to discover, and that every report names the real model, its data and its
numbers.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from e2e_support import BIN, REPO, base_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

# A handful of first turns, short answers, a short training and the smallest gate that still
# decides.
SMALL_REAL = [
    "mix.total=8",
    "regen.max_new_tokens=24",
    "train.epochs=1",
    "vocab.draft_vocab_size=1024",
    "gate.prompts_per_set=4",
    "gate.warmup_requests=1",
    "gate.max_new_tokens=24",
    "gate.traffic={1: 1.0}",
    "gate.max_rounds=2",
    "gate.min_accept=1.0",  # eight conversations teach a draft little: measure it, do not refuse it
]


@pytest.fixture(scope="module")
def night(smollm2_world: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("real-night")
    args = [str(BIN / "eagle3"), "run", "--recipe", "smollm2"]
    for override in [f"root={root}", *SMALL_REAL]:
        args += ["--set", override]
    env = base_env(PREFECT_HOME=str(tmp_path_factory.mktemp("prefect-home")))
    done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=1500)
    return {"root": root, "done": done, "world": smollm2_world}


def _stage(root: Path, name: str) -> Path:
    (stage,) = [d for d in (root / name).iterdir() if d.is_dir()]
    return stage


def test_the_real_night_runs_every_stage_to_the_gates_verdict(night):
    done = night["done"]
    assert done.returncode in (0, 1, 3), done.stderr[-4000:]
    assert "Traceback" not in done.stderr
    assert "SmolLM2-135M-Instruct" in done.stdout + done.stderr


def test_sharegpt_came_from_the_registry_through_the_catalog_with_its_license_and_size(night):
    catalog = json.loads((_stage(night["root"], "catalog") / "catalog.json").read_text())
    (sharegpt,) = catalog["datasets"]
    assert (sharegpt["adapter"], sharegpt["license"]) == ("sharegpt", "apache-2.0")
    assert (
        sharegpt["bytes"] == 125_509_632 and sharegpt["rows"] == 17_672
    )  # 17,671 whole rows + the cut tail
    bad = json.loads(night["world"].bad_rows.read_text())["sharegpt"]
    assert [(r["row"], r["reason"]) for r in bad] == [(17_671, "malformed")]


def test_regen_kept_the_engines_token_ids_on_the_real_tokenizer(night):
    regen = _stage(night["root"], "regen")
    rows = pq.read_table(regen / "shard-00000.parquet").to_pylist()
    assert rows and all(r["status"] in ("ok", "truncated") for r in rows)
    for row in rows:  # the last turn's ids are the prompt as sent and the output as received
        assert len(row["input_ids"]) == row["prompt_tokens"] + row["completion_tokens"]
        assert (
            json.loads(row["meta"])["turns"] == 1
        )  # regen.max_turns: the first turn, as MT-bench asks


def test_the_gate_report_and_the_model_card_name_the_real_model_and_its_prompt_set(night):
    gate = _stage(night["root"], "gate")
    report = json.loads((gate / "report.json").read_text())
    assert report["target"].endswith("SmolLM2-135M-Instruct")
    assert report["prompts"] == {"mt_bench": 4}
    assert "SmolLM2-135M-Instruct" in (gate / "report.md").read_text()
    (export,) = list((night["root"] / "drafts").glob("*/export"))
    card = (export / "README.md").read_text()
    assert (
        "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "license: apache-2.0" in card
    )
    config = json.loads((export / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert config["vocab_size"] == 49_152


@pytest.mark.sglang
def test_real_sglang_serves_the_real_draft(night, sglang_python, tmp_path):
    """The preflight against SGLang 0.5.23 itself, from the launch line the pipeline generates: its
    server loads the target and the draft, names EAGLE3 and the draft path, and speculates (verify
    passes counted). The smoke's accept-length floor is 1.0 here: a draft of eight conversations
    proves the serving path, not its quality (the gate measures that)."""
    from eagle3.recipes import resolve
    from eagle3.serve.launch_commands import build_launch

    root = night["root"]
    (export,) = list((root / "drafts").glob("*/export"))
    overrides = [f"root={root}", "server.engine=sglang", *SMALL_REAL]
    command = build_launch(resolve("smollm2", overrides), "eagle3", draft=export, port=0)
    features = str(_stage(root, "features"))
    args = [str(BIN / "eagle3"), "preflight", "--draft", str(export), "--recipe", "smollm2"]
    args += ["--features", features, "--min-accept", "1.0"]
    for override in overrides:
        args += ["--set", override]
    with command.server(log_path=tmp_path / "sglang-eagle3.log") as server:
        done = subprocess.run(
            [*args, "--url", server.url],
            env=base_env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.startswith("FAIL")]
    assert any(line.startswith("PASS smoke_accept") for line in lines), done.stdout
