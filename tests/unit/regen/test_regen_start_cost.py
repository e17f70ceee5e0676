"""The regen command's start cost: its flow and its tokenizer never import torch (~10 s of a busy
machine's start-up before the first request), since a regen client needs a tokenizer and HTTP, not a
tensor library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

_LOAD = """
import sys
import flows.commands.regen, flows.regen
from eagle3.target_io import TargetRef, load_tokenizer
tokenizer = load_tokenizer(TargetRef(sys.argv[1]))
assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
print(sorted(m for m in ("torch", "transformers.modeling_utils") if m in sys.modules))
"""


def test_the_regen_flow_and_a_plain_fast_tokenizer_load_without_torch(tiny_world):
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, str(tiny_world.model_dir)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
