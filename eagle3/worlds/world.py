"""The tiny offline world: sample datasets, a trained tiny chat target and pre-tokenized rows, built
once and cached.

Design choices:
- A world is a pure function of its `TinyWorldSpec`; its directory is named by the spec's
  fingerprint (spec JSON plus `WORLD_VERSION`), so a changed spec or a changed builder never reuses
  a stale world.
- It is built in a hidden temporary directory, `world.json` is written last, and the directory is
  renamed into place atomically: a world directory either holds `world.json` (done, a cache hit) or
  does not exist.
- `world.json` stores paths relative to the world root, so a cache directory can be moved or copied.
- The target trains on conversations from the same templates as the sample rows (another seed), so
  its greedy answers to the sample prompts are on-topic and low-entropy, which gives a draft
  something to learn.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from eagle3.worlds.conversations import Conversation, generate_conversations
from eagle3.worlds.samples import BAD_ROWS_FILE, MANIFEST_FILE, SAMPLES_VERSION, write_samples

logger = logging.getLogger(__name__)
T = TypeVar("T")

WORLD_VERSION = "2"  # 2: model vocabulary padded to spec.vocab_size
WORLD_FILE = "world.json"
PRETOKENIZED_FILE = "pretokenized.parquet"
PRETOKENIZED_SCHEMA = pa.schema(
    [("id", pa.string()), ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8()))]
)


MODEL_SEED_ENV = "EAGLE3_TINY_WORLD_MODEL_SEED"


def model_seed_from_env() -> int | None:
    """`EAGLE3_TINY_WORLD_MODEL_SEED`, the seed a world's target is initialised and trained from
    (unset: None)."""
    value = os.environ.get(MODEL_SEED_ENV, "").strip()
    return int(value) if value else None


class WorldSpec(Protocol):
    """What ``build_world`` needs of a spec: a fingerprint and the name its directories start
    with."""

    DIR_PREFIX: ClassVar[str]
    VERSION: ClassVar[str]

    def fingerprint(self) -> str: ...


@dataclass(frozen=True)
class TrainedWorldSpec:
    """What a world with sample datasets and a trained tiny Llama target depends on: the rows per
    source, the target's shape and its training. A world's spec sets its defaults, its directory
    prefix and ``VERSIONS``, the builder versions its fingerprint hashes beside the fields (bump one
    when its builder's output changes)."""

    DIR_PREFIX: ClassVar[str]
    VERSION: ClassVar[str]
    VERSIONS: ClassVar[dict[str, str]]
    seed: int = 0
    rows_per_source: int = 200
    vocab_size: int = 2048
    num_layers: int = 8
    hidden_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 352
    max_position_embeddings: int = 2048
    train_conversations: int = 4000
    train_steps: int = 200  # the loss plateaus by ~200 steps (0.55); 300 would add ~35 s on 2 cores
    train_batch_size: int = 8
    train_seq_len: int = 256
    train_lr: float = 3e-3
    # The target's init and training seed (None: `seed`), read from EAGLE3_TINY_WORLD_MODEL_SEED:
    # the same data and tokenizer, a differently trained target, as another machine's floats give;
    # the suite runs against it to find tests that hold one machine's trained values.
    model_seed: int | None = field(default_factory=model_seed_from_env)

    def fingerprint(self) -> str:
        """First 16 hex chars of sha256 over the spec JSON and ``VERSIONS``. An unset ``model_seed``
        is left out: a default world keeps the fingerprint it had before the field."""
        spec = {k: v for k, v in asdict(self).items() if not (k == "model_seed" and v is None)}
        payload = json.dumps({**self.VERSIONS, **spec}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TinyWorldSpec(TrainedWorldSpec):
    """Everything a tiny world depends on; the defaults are the world the tiny recipe and the e2e
    tests use."""

    DIR_PREFIX: ClassVar[str] = "tiny-world"
    VERSION: ClassVar[str] = WORLD_VERSION
    VERSIONS: ClassVar[dict[str, str]] = {
        "world_version": WORLD_VERSION,
        "samples_version": SAMPLES_VERSION,
    }
    pretokenized_rows: int = 50


@dataclass
class TinyWorld:
    """Paths into a built world (all absolute) and the build report."""

    root: Path
    data_dir: Path
    model_dir: Path
    samples: dict[str, Path]
    bench_dir: Path
    pretokenized: Path | None  # None: a world without pre-tokenized rows (the thinking world)
    bad_rows: Path
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def manifest(self) -> Path:
        """`samples.json`: rows, bad rows, bytes and sha256 per sample file."""
        return self.data_dir / MANIFEST_FILE

    def load_bad_rows(self) -> dict[str, list[dict[str, Any]]]:
        """Ground truth: `{adapter: [{"row", "reason", "detail"}]}`, including `pretokenized`."""
        return json.loads(self.bad_rows.read_text())

    def to_json(self) -> dict[str, Any]:
        def rel(path: Path) -> str:
            return path.relative_to(self.root).as_posix()

        return {
            "data_dir": rel(self.data_dir),
            "model_dir": rel(self.model_dir),
            "samples": {name: rel(path) for name, path in self.samples.items()},
            "bench_dir": rel(self.bench_dir),
            "pretokenized": rel(self.pretokenized) if self.pretokenized else None,
            "bad_rows": rel(self.bad_rows),
            "report": self.report,
        }

    @classmethod
    def from_json(cls, root: Path, data: dict[str, Any]) -> TinyWorld:
        return cls(
            root=root,
            data_dir=root / data["data_dir"],
            model_dir=root / data["model_dir"],
            samples={name: root / path for name, path in data["samples"].items()},
            bench_dir=root / data["bench_dir"],
            pretokenized=root / data["pretokenized"] if data["pretokenized"] else None,
            bad_rows=root / data["bad_rows"],
            report=data["report"],
        )

    @classmethod
    def load(cls, root: Path) -> TinyWorld:
        return cls.from_json(root, json.loads((root / WORLD_FILE).read_text())["world"])


def world_dir_for(cache_dir: Path, spec: WorldSpec) -> Path:
    """Where the world for `spec` lives (or will), without building it."""
    return Path(cache_dir) / f"{spec.DIR_PREFIX}-{spec.fingerprint()}"


def default_threads() -> int:
    """Up to 4 threads on an idle machine, 1 on a busy one (load above the core count): there,
    OpenMP threads that wait on each other made a training step ~7x slower than one thread. Training
    gave bit-identical weights with 1 and 2 threads, so the thread count is not part of the spec."""
    cores = os.cpu_count() or 1
    busy = hasattr(os, "getloadavg") and os.getloadavg()[0] > cores
    return 1 if busy else min(4, cores)


def _pretokenized_rows(
    tokenizer: Any, conversations: list[Conversation], *, vocab_size: int, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Chat-template rows with the assistant mask, plus 2 planted `malformed` rows (an id outside
    the vocab; `input_ids` and `loss_mask` of different lengths)."""
    rows = []
    for i, conv in enumerate(conversations):
        enc = tokenizer.apply_chat_template(
            conv, return_dict=True, return_assistant_tokens_mask=True
        )
        rows.append(
            {
                "id": f"pretok-{i:04d}",
                "input_ids": enc["input_ids"],
                "loss_mask": enc["assistant_masks"],
            }
        )
    rng = random.Random(seed)
    bad_id, bad_len = (dict(r) for r in rng.sample(rows, 2))
    bad_id["input_ids"] = [*bad_id["input_ids"][:-1], vocab_size + 7]
    bad_len["loss_mask"] = bad_len["loss_mask"][:-3]
    planted = [({**bad_id, "id": "pretok-bad-id"}, "token id >= vocab_size")]
    planted.append(({**bad_len, "id": "pretok-bad-len"}, "len(loss_mask) != len(input_ids)"))
    records = []
    for row, detail in planted:
        at = rng.randrange(len(rows) + 1)
        rows.insert(at, row)
        records = [{**r, "row": r["row"] + 1} if r["row"] >= at else r for r in records]
        records.append({"row": at, "reason": "malformed", "detail": detail})
    return rows, sorted(records, key=lambda r: r["row"])


def _write_pretokenized(
    world_root: Path, tokenizer: Any, spec: TinyWorldSpec, vocab_size: int
) -> Path:
    """Write `pretokenized.parquet` and add its rows to `bad_rows.json` and `samples.json`."""
    data_dir = world_root / "data"
    conversations = generate_conversations(spec.pretokenized_rows, seed=spec.seed + 2)
    rows, records = _pretokenized_rows(
        tokenizer, conversations, vocab_size=vocab_size, seed=spec.seed
    )
    path = data_dir / PRETOKENIZED_FILE
    table = pa.Table.from_pylist(rows, schema=PRETOKENIZED_SCHEMA)
    pq.write_table(table.replace_schema_metadata({"vocab_size": str(vocab_size)}), path)
    bad_rows = json.loads((data_dir / BAD_ROWS_FILE).read_text())
    (data_dir / BAD_ROWS_FILE).write_text(
        json.dumps(bad_rows | {"pretokenized": records}, indent=1) + "\n"
    )
    manifest = json.loads((data_dir / MANIFEST_FILE).read_text())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest["files"]["pretokenized"] = {
        "path": PRETOKENIZED_FILE,
        "rows": len(rows),
        "bad_rows": len(records),
        "bytes": path.stat().st_size,
        "sha256": digest,
    }
    (data_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def _build_into(
    root: Path, spec: TinyWorldSpec, say: Callable[[str], None], threads: int
) -> TinyWorld:
    """Build every part of a world under `root` (a fresh directory) and return it, `world.json` not
    yet written."""
    # only to build: resolving a recipe (every `eagle3 --recipe tiny` command) must not load them
    import torch
    import transformers

    from eagle3.worlds.tiny_target import build_model, build_tokenizer, train_model

    started = time.perf_counter()
    say(f"writing sample datasets ({spec.rows_per_source} rows per source)")
    samples = write_samples(root / "data", seed=spec.seed, rows_per_source=spec.rows_per_source)
    conversations = generate_conversations(spec.train_conversations, seed=spec.seed + 1)
    say(f"training tokenizer (vocab {spec.vocab_size})")
    tokenizer = build_tokenizer(
        (m["content"] for conv in conversations for m in conv), vocab_size=spec.vocab_size
    )
    tokenizer.model_max_length = spec.max_position_embeddings
    model_seed = spec.seed if spec.model_seed is None else spec.model_seed
    model = build_model(
        tokenizer,
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        vocab_size=spec.vocab_size,
        seed=model_seed,
    )
    say(f"training tiny target ({spec.train_steps} steps, {threads} threads)")
    train_started = time.perf_counter()
    losses = train_model(
        model,
        tokenizer,
        conversations,
        steps=spec.train_steps,
        batch_size=spec.train_batch_size,
        seq_len=spec.train_seq_len,
        lr=spec.train_lr,
        seed=model_seed,
        num_threads=threads,
    )
    train_seconds = time.perf_counter() - train_started
    say("saving model and tokenizer")
    model_dir = root / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    say("writing pre-tokenized rows")
    pretokenized = _write_pretokenized(root, tokenizer, spec, model.config.vocab_size)
    report = {
        "fingerprint": spec.fingerprint(),
        "train_loss_first": losses[0],
        "train_loss_last": losses[-1],
        "train_seconds": round(train_seconds, 2),
        "train_threads": threads,
        "params": sum(p.numel() for p in model.parameters()),
        "vocab_size": model.config.vocab_size,
        "model_bytes": sum(p.stat().st_size for p in model_dir.iterdir() if p.is_file()),
        "build_seconds": round(time.perf_counter() - started, 2),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    data_dir = root / "data"
    return TinyWorld(
        root=root,
        data_dir=data_dir,
        model_dir=model_dir,
        samples={k: v for k, v in samples.items() if k != "bench"},
        bench_dir=samples["bench"],
        pretokenized=pretokenized,
        bad_rows=data_dir / BAD_ROWS_FILE,
        report=report,
    )


def build_tiny_world(
    cache_dir: Path,
    spec: TinyWorldSpec | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    num_threads: int | None = None,
) -> tuple[TinyWorld, bool]:
    """Return the world for `spec` under `cache_dir` and whether it was a cache hit (nothing
    rebuilt).

    `spec` defaults to `TinyWorldSpec()`; `progress` receives one line per build stage;
    `num_threads` defaults to `default_threads()`.
    """
    return build_world(
        cache_dir, spec or TinyWorldSpec(), _build_into, progress=progress, num_threads=num_threads
    )


Builder = Callable[[Path, Any, Callable[[str], None], int], TinyWorld]


def world_builders() -> dict[str, Callable[..., tuple[TinyWorld, bool]]]:
    """The dev worlds by name (``dev.world``, ``eagle3 dev build-tiny --world``): each builder takes
    the cache directory, ``progress`` and ``num_threads`` and returns the world and whether it was a
    cache hit."""
    from eagle3.worlds.served_traffic import build_served_traffic  # they build on this module
    from eagle3.worlds.smollm2_world import build_smollm2_world
    from eagle3.worlds.think_world import build_think_world

    builders = {"tiny": build_tiny_world, "think": build_think_world}
    return builders | {"served": build_served_traffic, "smollm2": build_smollm2_world}


def build_cached(
    final: Path, build_into: Callable[[Path], T], *, say: Callable[[str], None] = logger.info
) -> T | None:
    """Unless ``final/world.json`` exists, ``build_into(tmp)`` (which writes ``world.json`` last) in
    a hidden temporary directory beside ``final``, renamed into place; what it returned, or None on
    a cache hit.

    A world directory so only ever appears complete. A concurrent builder that finishes first wins
    the rename; this call then uses its world and drops its own.
    """
    if (final / WORLD_FILE).exists():
        return None
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        built = build_into(tmp)
        if final.exists() and not (final / WORLD_FILE).exists():
            # an empty or foreign leftover: world dirs only ever appear complete
            shutil.rmtree(final)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / WORLD_FILE).exists():
                raise
            say("another builder finished first; using its world")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return built


def build_world(
    cache_dir: Path,
    spec: WorldSpec,
    build_into: Builder,
    *,
    progress: Callable[[str], None] | None = None,
    num_threads: int | None = None,
) -> tuple[TinyWorld, bool]:
    """The world ``build_into(root, spec, say, threads)`` builds for ``spec``, cached under
    ``cache_dir`` by the spec's fingerprint (``build_cached``), and whether it was a cache hit."""

    def say(message: str) -> None:
        logger.info("%s %s: %s", spec.DIR_PREFIX.replace("-", " "), spec.fingerprint(), message)
        if progress is not None:
            progress(message)

    def build(tmp: Path) -> TinyWorld:
        world = build_into(tmp, spec, say, num_threads or default_threads())
        payload = {"world_version": spec.VERSION, "spec": asdict(spec), "world": world.to_json()}
        (tmp / WORLD_FILE).write_text(json.dumps(payload, indent=1) + "\n")
        return world

    final = world_dir_for(cache_dir, spec)
    world = build_cached(final, build, say=say)
    if world is None:
        say(f"cache hit at {final}")
        return TinyWorld.load(final), True
    say(f"built in {world.report['build_seconds']} s at {final}")
    return TinyWorld.load(final), False
