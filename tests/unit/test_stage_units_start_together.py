"""Units that start together on a fresh process: the first imports of lazily importing libraries
(transformers) happen once, before the units, so no unit fails with "cannot import name
'AutoTokenizer' from 'transformers'"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SHARDS = 8

# A fresh interpreter (nothing of transformers imported) that captures every shard of a regen stage
# at once.
_CAPTURE_ALL_AT_ONCE = """
import json, sys
from eagle3.capture.stage import CaptureStage
from eagle3.recipes import load_recipe
from eagle3.stage import UnitsFailed, run_stage

assert not any(name.startswith("transformers") for name in sys.modules), "not a fresh process"
root, regen_dir, shards = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = load_recipe("tiny", [f"root={root}", f"capture.shards_in_flight={shards}", "capture.device=cpu"])
try:
    result = run_stage(CaptureStage(), config, regen_dir=regen_dir)
    print(json.dumps({"done": result.done, "failed": []}))
except UnitsFailed as exc:
    print(json.dumps({"done": False, "failed": exc.units, "error": str(exc)}))
"""


def test_capture_shards_starting_at_once_on_a_fresh_process_all_finish(
    write_regen_stage, tmp_path: Path
):
    regen_dir = write_regen_stage(tmp_path / "regen" / "fresh0start0fp", shards=SHARDS, rows=2)
    command = [
        sys.executable,
        "-c",
        _CAPTURE_ALL_AT_ONCE,
        str(tmp_path / "root"),
        str(regen_dir),
        str(SHARDS),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "OMP_NUM_THREADS": "1",
    }
    ran = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert ran.returncode == 0, ran.stderr[-4000:]
    outcome = json.loads(ran.stdout.strip().splitlines()[-1])
    assert outcome == {"done": True, "failed": []}, outcome
    assert "cannot import name" not in ran.stderr
