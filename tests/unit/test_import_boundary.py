"""The library never imports the layers above it (DESIGN §1: deployments/flows -> tasks -> eagle3)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = {"prefect", "prefect_ray", "typer", "tasks", "flows", "deployments"}


def _imported_modules(path: Path) -> set[str]:
    """Every absolute module a file imports, function-local imports included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def _imported_roots(path: Path) -> set[str]:
    return {module.split(".")[0] for module in _imported_modules(path)}


def test_library_source_never_imports_prefect_or_upper_layers():
    offenders = {
        str(p.relative_to(REPO)): sorted(_imported_roots(p) & FORBIDDEN)
        for p in sorted((REPO / "eagle3").rglob("*.py"))
        if _imported_roots(p) & FORBIDDEN
    }
    assert offenders == {}


def test_tasks_never_import_flows():
    offenders = [str(p) for p in (REPO / "tasks").rglob("*.py") if _imported_roots(p) & {"flows", "deployments"}]
    assert offenders == []


def test_importing_the_library_does_not_load_prefect():
    code = (
        "import importlib, pkgutil, sys, eagle3\n"
        "for m in pkgutil.walk_packages(eagle3.__path__, 'eagle3.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] in {'prefect', 'typer'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"



def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    modules = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    return modules | {node.module for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}


def test_model_package_is_architecture_only():
    """``eagle3/model`` (draft head, export format, vocab type) imports no stage code, not even inside functions."""
    allowed = {"eagle3.config", "eagle3.runroot", "eagle3.layout"}
    offenders = {
        str(p.relative_to(REPO)): upward
        for p in sorted((REPO / "eagle3" / "model").rglob("*.py"))
        if (upward := sorted(m for m in _imported_modules(p) if m.startswith("eagle3.")
                             and m not in allowed and not m.startswith("eagle3.model.")))
    }
    assert offenders == {}
