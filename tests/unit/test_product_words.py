"""The product's text speaks for itself: no work-log citations in the shipped tree, and every dotted
name a docstring points at exists.

* A citation of an issue number, of a design document the repository does not hold or of a
  task's wording ("the brief", "the mission") tells a reader nothing they can open; the knowledge
  belongs in ``docs/`` under a heading, cited by that heading.
* A docstring's ``eagle3.x.Name`` is a promise that the name exists: after a move or a rename it
  would send the reader nowhere.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("eagle3", "flows", "tasks", "deployments", "benchmarks")
DOCSTRING_PACKAGES = ("eagle3", "flows", "tasks")

# What a citation outside the repository looks like, case-insensitive.
CITATIONS = {
    "an issue number": r"\bissues? ?#?\d+",
    "a section number": r"§ ?\d",
    "the design notes by section": r"\bDESIGN §",
    "a task's brief": r"\bbrief\b",
    "a task's mission": r"\bmission\b",
    "a document the repository does not hold": r"\bSGLANG_CPU\.md\b",
}
_CITATION = re.compile("|".join(f"(?:{p})" for p in CITATIONS.values()), re.IGNORECASE)

# A double-backquoted dotted name into the project's own packages, with an optional call.
_DOTTED = re.compile(r"``((?:" + "|".join(DOCSTRING_PACKAGES) + r")(?:\.[A-Za-z_]\w*)+)(?:\(\))?``")


def _tracked(*roots: str) -> list[Path]:
    command = ["git", "ls-files", "-z", "--", *roots]
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / name for name in out.split("\0") if name]


def _is_test(path: Path) -> bool:
    parts = path.relative_to(REPO).parts
    return "tests" in parts or path.name.startswith("test_") or path.name == "conftest.py"


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary file (one with a NUL byte) or one gone from disk."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:  # deleted in the work tree, not yet in the index
        return None
    return None if b"\0" in data else data.decode("utf-8", errors="replace")


def citations() -> list[str]:
    """``path:line: text`` for each line of a shipped, non-test file that cites outside the repo."""
    hits = []
    for path in _tracked(*SHIPPED):
        text = None if _is_test(path) else _text(path)
        for number, line in enumerate((text or "").splitlines(), 1):
            if _CITATION.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}")
    return hits


_DOCUMENTED = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docstrings(tree: ast.Module) -> list[str]:
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, _DOCUMENTED))]
    return [doc for node in nodes if (doc := ast.get_docstring(node, clean=False))]


def docstring_names() -> dict[str, list[str]]:
    """Every ``pkg.mod.Name`` in a docstring of the project's packages -> the files that cite it."""
    names: dict[str, list[str]] = {}
    for path in _tracked(*DOCSTRING_PACKAGES):
        if path.suffix != ".py" or _is_test(path) or not path.exists():
            continue
        for doc in _docstrings(ast.parse(path.read_text(), filename=str(path))):
            for name in _DOTTED.findall(re.sub(r"\s+", " ", doc)):
                names.setdefault(name, []).append(str(path.relative_to(REPO)))
    return names


# Runs in a child: importing a module can have effects on the process (SGLang's CPU shim replaces
# SGLang's kernel package in the process that imports it), so the test's own process imports none.
# A name that is a module is found without importing it (an entry point may run at import).
_RESOLVE = r"""
import importlib, importlib.util, json, sys

def resolve(name):
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module_name) is None:
                continue  # this prefix is not a module: try a shorter one
            if cut == len(parts):
                return None
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue
            return f"importing {module_name} failed: {exc}"
        except (Exception, SystemExit) as exc:  # a module that exits at import is a finding too
            return f"importing {module_name} failed: {type(exc).__name__}: {exc}"
        for attr in parts[cut:]:
            fields = getattr(obj, "model_fields", None) or getattr(obj, "__dataclass_fields__", {})
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif attr in fields or attr in getattr(obj, "__annotations__", {}):
                obj = None  # a field of a model or dataclass: nothing further to walk
            else:
                return f"{module_name} has no {'.'.join(parts[cut:])}"
        return None
    return "no importable prefix"

problems = {name: why for name in json.load(sys.stdin) if (why := resolve(name))}
print(json.dumps(problems))
"""


def unresolved(names: list[str]) -> dict[str, str]:
    """name -> why it does not resolve, importing in a child process."""
    out = subprocess.run(
        [sys.executable, "-c", _RESOLVE],
        input=json.dumps(names),
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("line", "cites"),
    [
        ("(issue 15)", True),
        ("fixed in issue #48", True),
        ("(DESIGN §4)", True),
        ("as the brief says", True),
        ("at the mission's scale", True),
        ("see SGLANG_CPU.md", True),
        ("Explain it briefly.", False),
        ("except PermissionError:", False),
        ("woken on readmission", False),
        ("SGLANG_CPU_OMP_THREADS_BIND", False),
        ('(docs/DESIGN.md, "Aux layers")', False),
    ],
)
def test_the_citation_pattern_tells_citations_from_lookalikes(line, cites):
    assert bool(_CITATION.search(line)) is cites


def test_shipped_files_cite_nothing_outside_the_repository():
    hits = citations()
    assert not hits, "\n".join(hits)


def test_every_dotted_name_in_a_docstring_resolves():
    names = docstring_names()
    assert names, "no docstring names found: the pattern no longer matches the docstrings"
    problems = unresolved(sorted(names))
    assert {name: (why, names[name]) for name, why in problems.items()} == {}
