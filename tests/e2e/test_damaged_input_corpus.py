"""The malformed and damaged-input corpus through the stage commands, as a user meets it: each case
runs ``eagle3
...`` in a process of its own and reads its console. Every case exits with the code README's table
gives (0 ok, 1 the work ran and could not finish, 2 bad usage, config or input, damaged data
included), an expected failure ends with one ``error:`` line and prints no traceback (Prefect's
records of it keep theirs, for the UI), and an unexpected failure, a bug, still shows its traceback.

The stages the commands read are built once with the library (prompts, a finished regen stage,
features, vocab); each case damages its own copy of them. The commands share the session's Prefect
API (``PREFECT_API_URL``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3.capture.manifest import finalize_features
from eagle3.capture.schema import FEATURE_SCHEMA
from eagle3.capture.shard import capture_shard
from eagle3.capture.stage import FeatureSource
from eagle3.config.pipeline import with_overrides
from eagle3.data.parquet import ShardWriter
from eagle3.data.schema import PROMPT_SCHEMA
from eagle3.rundir.layout import shard_name
from eagle3.rundir.runroot import FileEntry, Manifest
from eagle3.runtime.procs import free_port
from eagle3.train.vocab import build_vocab_stage

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TRAIN = [
    "vocab.draft_vocab_size=64",
    "train.max_steps=4",
    "train.ttt_steps=2",
    "train.batch_size=2",
    "train.save_every=2",
    "train.log_every=1",
    "train.max_seq_len=256",
]
GOOD_ROW = {
    "conversations": [
        {"from": "human", "value": "What is a good name for a cat?"},
        {"from": "gpt", "value": "Tom."},
    ]
}


@dataclass(frozen=True)
class Stages:
    """A finished run root: prompts, regen (with its manifest), features and vocab directories."""

    root: Path
    prompts: Path
    regen: Path
    features: Path
    vocab: Path

    def copy(self, to: Path) -> Stages:
        shutil.copytree(self.root, to / "root")
        return Stages(
            *(
                to / "root" / p.relative_to(self.root)
                for p in (self.root, self.prompts, self.regen, self.features, self.vocab)
            )
        )


def _write_prompts(out: Path, shards: int = 2, rows: int = 3) -> Path:
    files = []
    for s in range(shards):
        data = [
            {
                "sample_id": f"{s}-{i}",
                "source": "t",
                "source_row": str(i),
                "n_user_turns": 1,
                "meta": "{}",
                "messages": [{"role": "user", "content": f"question {s} {i}"}],
                "input_ids": None,
                "loss_mask": None,
            }
            for i in range(rows)
        ]
        with ShardWriter(out, PROMPT_SCHEMA, start_index=s) as writer:
            writer.write_rows(data)
            (info,) = writer.close()
        files.append(FileEntry.of(info.path, rows=info.rows, base=out))
    Manifest(stage="prompts", fingerprint=out.name, files=files).write(out)
    return out


@pytest.fixture(scope="module")
def stages(tiny_config, write_regen_stage, tmp_path_factory) -> Stages:
    root = tmp_path_factory.mktemp("corpus") / "root"
    config = with_overrides(tiny_config, [f"root={root}", *TRAIN])
    prompts = _write_prompts(root / "prompts" / "promptsfp")
    regen = write_regen_stage(root / "regen" / "regenfp", shards=1, rows=8, seed=5)
    shard = regen / shard_name(0)
    Manifest(
        stage="regen", fingerprint=regen.name, files=[FileEntry.of(shard, rows=8, base=regen)]
    ).write(regen)
    features = root / "features" / "featfp"
    finalize_features(config, features, [capture_shard(config, shard, features)["shard_index"]])
    vocab = build_vocab_stage(config, FeatureSource.stored(features))
    return Stages(root, prompts, regen, features, vocab)


@pytest.fixture(scope="module")
def command_env(prefect_harness) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    return {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_API_URL": str(PREFECT_API_URL.value())}


# ---- the damage, each done to a copy of the stages


def _flip(path: Path, at: int, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    data[at : at + count] = bytes(b ^ 0xFF for b in data[at : at + count])
    path.write_bytes(bytes(data))


def _inside(path: Path, column: str = "aux_hidden") -> int:
    """An offset inside row group 0's ``column`` pages: the size and the footer stay as they
    were."""
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(FEATURE_SCHEMA.names.index(column))
    return (
        chunk.dictionary_page_offset or chunk.data_page_offset
    ) + chunk.total_compressed_size // 2


def _sharegpt_source(path: Path) -> list[str]:
    return ["--set", f"sources=[{{adapter: sharegpt, path: '{path}'}}]"]


def _source(tmp: Path, name: str, data: bytes) -> list[str]:
    (tmp / name).write_bytes(data)
    return _sharegpt_source(tmp / name)


def _cut_short_parquet(tmp: Path) -> list[str]:
    path = tmp / "cut.parquet"
    pq.write_table(pa.Table.from_pylist([GOOD_ROW] * 20), path)
    path.write_bytes(path.read_bytes()[:-100])
    return _sharegpt_source(path)


@dataclass
class Case:
    """One corpus case: ``make(stages copy, tmp dir)`` damages what it needs and returns the
    command's arguments."""

    name: str
    make: Callable[[Stages, Path], list[str]]
    code: int
    says: str  # in the error line (or the output, for a success)


def _root(s: Stages) -> list[str]:
    return ["--set", f"root={s.root}", *(arg for item in TRAIN for arg in ("--set", item))]


def _dead_server() -> list[str]:
    return [
        "--set",
        f"regen.servers=[http://127.0.0.1:{free_port()}]",
        "--set",
        "regen.no_server_timeout_s=2",
    ]


def _damaged_prompts(s: Stages, tmp: Path) -> list[str]:
    _flip(s.prompts / shard_name(1), 200)
    # never reaches a server
    return ["regen", "--prompts", str(s.prompts), *_root(s), *_dead_server()]


def _damaged_regen(s: Stages, tmp: Path) -> list[str]:
    _flip(s.regen / shard_name(0), 200)
    return ["capture", "--regen-dir", str(s.regen), *_root(s)]


def _truncated_features(s: Stages, tmp: Path) -> list[str]:
    shard = s.features / shard_name(0)
    shard.write_bytes(shard.read_bytes()[:-100])
    return ["train", "--features", str(s.features), "--vocab", str(s.vocab), *_root(s)]


def _features_damaged_in_place(s: Stages, tmp: Path) -> list[str]:
    shard = s.features / shard_name(0)
    _flip(shard, _inside(shard), count=8)
    return ["train", "--features", str(s.features), "--vocab", str(s.vocab), *_root(s)]


def _vocab_of_damaged_features(s: Stages, tmp: Path) -> list[str]:
    shard = s.features / shard_name(0)
    _flip(shard, _inside(shard, "input_ids"), count=8)  # the column a vocab reads
    shutil.rmtree(s.vocab.parent)  # not built yet
    return ["vocab", "--features", str(s.features), *_root(s)]


# a good row, then rows that are wrong in type, shape or JSON (cut short): quarantined, the command
# succeeds
_BAD_ROWS = [
    '{"conversations": "nope"}',
    "42",
    '{"conversations": [{"from": "human"}]}',
    json.dumps(GOOD_ROW)[:30],
]
_MALFORMED_ROWS = "\n".join([json.dumps(GOOD_ROW), *_BAD_ROWS]).encode()

CASES = [
    Case(
        "empty source file",
        lambda s, t: ["discover", *_root(s), *_source(t, "empty.jsonl", b"")],
        2,
        "empty file (0 bytes)",
    ),
    Case(
        "UTF-16 source file",
        lambda s, t: [
            "discover",
            *_root(s),
            *_source(t, "utf16.json", json.dumps([GOOD_ROW]).encode("utf-16")),
        ],
        2,
        "UTF-16/32, not UTF-8",
    ),
    Case(
        "not-JSON source file",
        lambda s, t: ["discover", *_root(s), *_source(t, "binary.jsonl", bytes(range(1, 256)) * 8)],
        2,
        "does not start with readable rows",
    ),
    Case(
        "cut-short Parquet source file",
        lambda s, t: ["discover", *_root(s), *_cut_short_parquet(t)],
        2,
        "not a readable Parquet file",
    ),
    Case(
        "malformed rows (quarantined)",
        lambda s, t: ["normalize", *_root(s), *_source(t, "rows.jsonl", _MALFORMED_ROWS)],
        0,
        "prompts:",
    ),
    Case(
        "damaged prompts shard",
        _damaged_prompts,
        2,
        "promptsfp/shard-00001.parquet: sha256 differs",
    ),
    Case("damaged regen shard", _damaged_regen, 2, "regenfp/shard-00000.parquet: sha256 differs"),
    Case("truncated feature shard", _truncated_features, 2, "(truncated or replaced)"),
    Case(
        "feature shard damaged in place",
        _features_damaged_in_place,
        2,
        "row group 0: does not read back",
    ),
    Case(
        "vocab over damaged features",
        _vocab_of_damaged_features,
        2,
        "shard-00000.parquet: does not read back",
    ),
    Case(
        "regen with no server up",
        lambda s, t: ["regen", "--prompts", str(s.prompts), *_root(s), *_dead_server()],
        1,
        "no server healthy for 2s",
    ),
    Case(
        "unknown config section",
        lambda s, t: ["capture", *_root(s), "--set", "trainer.lr=1"],
        2,
        "'trainer'",
    ),
]


def _run(
    python: list[str], args: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *python, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_case_exits_as_the_table_says_with_one_error_line_and_no_traceback(
    case: Case, stages: Stages, command_env: dict[str, str], tmp_path: Path
):
    ran = _run(["-m", "flows.cli"], case.make(stages.copy(tmp_path), tmp_path), command_env)
    console = ran.stdout + ran.stderr
    assert ran.returncode == case.code, console[-6000:]
    assert "Traceback" not in console, console[-6000:]
    if case.code == 0:
        assert case.says in ran.stdout, console[-3000:]
        return
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and ran.stderr.rstrip().endswith(errors[0]), ran.stderr[-3000:]
    assert case.says in errors[0], errors[0]


def test_serve_on_a_port_in_use_is_bad_usage(command_env: dict[str, str]):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ran = _run(
            ["-m", "flows.cli"],
            ["serve", "--synthetic-tokens", "4", "--host", "127.0.0.1", "--port", str(port)],
            command_env,
        )
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert (
        ran.stderr.strip().splitlines() == [ran.stderr.strip()]
        and f"127.0.0.1:{port}" in ran.stderr
    )


# A bug in a unit (not an expected failure): injected before the command runs
_WITH_A_BUG = """
import sys
import eagle3.capture.shard as run

def read_regen_shard(path):
    raise RuntimeError("injected bug")

run.read_regen_shard = read_regen_shard
sys.argv[0] = "eagle3"
from flows.cli import main
main()
"""


def test_an_unexpected_failure_still_shows_its_traceback(
    stages: Stages, command_env: dict[str, str], tmp_path
):
    copy = stages.copy(tmp_path)
    ran = _run(
        ["-c", _WITH_A_BUG], ["capture", "--regen-dir", str(copy.regen), *_root(copy)], command_env
    )
    assert ran.returncode == 1, ran.stderr[-6000:]
    assert (
        "Traceback (most recent call last)" in ran.stderr
        and "RuntimeError: injected bug" in ran.stderr
    )
    assert ran.stderr.rstrip().splitlines()[-1].startswith("error: capture failed for units [0]")
