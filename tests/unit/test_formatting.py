"""The formatter owns the line: the tree is as ``ruff format`` leaves it (line length 100), and lint
passes, so no change lands that a reviewer must re-wrap by hand."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: install the dev extra (pip install -e '.[dev]')")
    return found


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_the_tree_is_as_ruff_leaves_it(command):
    done = subprocess.run([_ruff(), *command, "."], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
