"""The library never imports the layers above it (docs/DESIGN.md,
"Layers": deployments/flows -> tasks -> eagle3)."""

from __future__ import annotations

import ast
import re
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
    offenders = [
        str(p)
        for p in (REPO / "tasks").rglob("*.py")
        if _imported_roots(p) & {"flows", "deployments"}
    ]
    assert offenders == []


# The SGLang CPU launcher is an entry point that installs its shim at import (in SGLang's
# interpreter, where every process it spawns re-imports it; it cannot be a __main__ module for that
# reason): it is not imported here.
ENTRY = "eagle3.serve.sglang_cpu.launch"


def test_importing_the_library_does_not_load_prefect():
    code = (
        f"ENTRY = {ENTRY!r}\n"
        "import importlib, pkgutil, sys, eagle3\n"
        "for m in pkgutil.walk_packages(eagle3.__path__, 'eagle3.'):\n"
        "    if not m.name.endswith('__main__') and m.name != ENTRY:\n"
        "        importlib.import_module(m.name)\n"
        "print(sorted(k for k in sys.modules if k.split('.')[0] in {'prefect', 'typer'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"


# The library's packages, lowest first: a package imports only packages of earlier rows (never a
# sibling or a row above it), function-local imports included, so no import cycle can hide in a
# function body. A new package must be placed here. ``__main__`` modules are entry points (they
# parse arguments and may resolve a recipe) and are exempt.
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(row)
    for row in (
        # config: StrictModel, one module per section, PipelineConfig, the SGLang layer-id
        {"config", "errors"},
        # contract (config.aux_layers); errors: DataError (exit 2), Stopped
        # rundir: the run root, its layout, integrity checks; runtime: processes, secrets, transfer;
        # target_io: the one door to the target's tokenizer, config and weights
        {"rundir", "runtime", "target_io"},
        {"stage"},  # the stage contract
        {
            "data",
            "model",
        },  # model: the draft architecture, the export format, the vocab mapping type
        # serve: the one server launcher, its commands, the SGLang pin; serve.reference: the
        # reference server; registry: the champion pointer and the promoted drafts (the gate writes,
        # train reads)
        {"serve", "registry"},
        {"regen", "capture"},
        # training (stored or online features: capture producers feed the trainer through Ray's
        # object
        {"train"},
        # store), the vocab and export writers
        {"gate"},  # the release gate: launches servers, measures, decides, promotes, publishes
        # the night: the curve, uniform and aimed planning, the selection, domain eval, its stages
        {"scaling"},
        {"worlds"},  # the offline worlds (tiny, think, domains)
        # configs by name (they name the worlds); which stage directory a config names; what
        # packages a config's modes need
        {"recipes", "lineage", "requirements"},
    )
)


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "eagle3" and len(parts) > 1 else None


def test_every_library_package_has_a_layer():
    placed = set().union(*LAYERS)
    found = {
        p.stem if p.is_file() else p.name
        for p in (REPO / "eagle3").iterdir()
        if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.name != "__init__.py"
    }
    assert found - placed == set(), "place each new package in LAYERS"
    assert placed - found == set(), "LAYERS names packages that no longer exist"


def test_library_packages_import_only_lower_layers():
    rank = {name: i for i, row in enumerate(LAYERS) for name in row}
    offenders = []
    for path in sorted((REPO / "eagle3").rglob("*.py")):
        own = _package(
            "eagle3." + ".".join(path.relative_to(REPO / "eagle3").with_suffix("").parts)
        )
        if path.name == "__main__.py" or own is None:
            continue
        for module in sorted(_imported_modules(path)):
            other = _package(module)
            if other is not None and other != own and rank[other] >= rank[own]:
                offenders.append(
                    f"{path.relative_to(REPO)} imports {module} ({own} is not above {other})"
                )
    assert offenders == []


def test_the_regen_command_path_never_imports_torch(tiny_world):
    """``eagle3 regen`` needs a tokenizer, not torch (~10 s of imports on a busy machine): the CLI,
    the flow, the stage and the warm-up that loads the tokenizer while Prefect's server starts stay
    free of it."""
    code = (
        "import sys\n"
        "from eagle3.config.pipeline import PipelineConfig\n"
        "from eagle3.config.target import TargetConfig\n"
        "from flows.commands.regen import _warm_up\n"
        "import flows.cli, flows.regen, eagle3.regen.stage\n"
        f"_warm_up(PipelineConfig(name='t', root='/tmp', target=TargetConfig(model_path={str(tiny_world.model_dir)!r},"
        " num_layers=8, hidden_size=64, vocab_size=512)))\n"
        "from eagle3.target_io import _tokenizer\n"
        "torch = sorted(k for k in sys.modules if k.split('.')[0] == 'torch')\n"
        "print(_tokenizer.cache_info().currsize, torch)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "1 []", (
        "the tokenizer is loaded (and cached for the shards) without torch"
    )


# The SGLang CPU shim (eagle3/serve/sglang_cpu) replaces SGLang's kernel package in the process that
# imports it, so it is imported only where SGLang runs on this CPU: its launchers (run in SGLang's
# interpreter) and the SGLang capture worker. What others need of SGLang (the pinned version, the
# CPU flags) is in ``eagle3.serve.sglang``.
SHIM = "eagle3.serve.sglang_cpu"
SHIM_IMPORTERS = ("eagle3/serve/sglang_cpu/launch*.py", "eagle3/capture/sglang/worker.py")


def _imports_of(path: Path, package: str) -> list[str]:
    """The imports of ``package`` (or a module of it) in ``path``, ``from parent import package``
    included."""
    found = {m for m in _imported_modules(path) if m == package or m.startswith(package + ".")}
    parent, _, name = package.rpartition(".")
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == parent and node.level == 0:
            found.update(f"{parent}.{alias.name}" for alias in node.names if alias.name == name)
    return sorted(found)


def test_only_the_launchers_and_the_capture_worker_import_the_sglang_cpu_shim():
    allowed = {p for pattern in SHIM_IMPORTERS for p in REPO.glob(pattern)}
    assert allowed, f"{SHIM_IMPORTERS} match no file: update SHIM_IMPORTERS"
    inside = REPO / Path(*SHIM.split("."))
    offenders = {
        str(p.relative_to(REPO)): _imports_of(p, SHIM)
        for top in ("eagle3", "flows", "tasks", "deployments", "benchmarks")
        for p in sorted((REPO / top).rglob("*.py"))
        if p not in allowed and inside not in p.parents and _imports_of(p, SHIM)
    }
    assert offenders == {}, (
        "import the SGLang pin and CPU flags from eagle3.serve.sglang, not the shim"
    )


def _architecture_map() -> dict[str, int]:
    """docs/ARCHITECTURE.md's module map: every module it lists, with the layer (1 = lowest) of the
    row it is in."""
    layers, layer = {}, 0
    for row in (REPO / "docs" / "ARCHITECTURE.md").read_text().splitlines():
        match = re.match(r"\| (\d*) \| [^|]* \| `(eagle3/[\w/]+\.py)` \|", row)
        if match:
            layer = int(match.group(1) or layer)
            layers[match.group(2)] = layer
    return layers


def test_the_architecture_map_lists_every_library_module_in_its_layer():
    listed = _architecture_map()
    files = {
        str(p.relative_to(REPO)) for p in (REPO / "eagle3").rglob("*.py") if p.name != "__init__.py"
    }
    assert files - set(listed) == set(), "add each new module to docs/ARCHITECTURE.md's module map"
    assert set(listed) - files == set(), (
        "docs/ARCHITECTURE.md's module map names modules that no longer exist"
    )
    rank = {name: i + 1 for i, row in enumerate(LAYERS) for name in row}
    misplaced = {
        path: layer
        for path, layer in listed.items()
        if rank[Path(path).parts[1].removesuffix(".py")] != layer
    }
    assert misplaced == {}, "the map's layer of each module is its package's row in LAYERS"
