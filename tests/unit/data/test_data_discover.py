"""Discovery of local files and of Hub datasets in an offline HF cache; Hub search ranking on
recorded records."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_stage_helpers import discover, normalize

from eagle3.data.discover import DiscoveryError, split_files
from eagle3.data.hub import HubError, rank_candidates
from eagle3.rundir.runroot import Manifest

FIXTURES = Path(__file__).parent / "fixtures"
SHA = "0123456789abcdef0123456789abcdef01234567"


def _catalog(out: Path) -> dict:
    return {d["name"]: d for d in json.loads((out / "catalog.json").read_text())["datasets"]}


def test_local_sources_are_resolved_with_rows_sizes_and_checked_format(config_factory, data_world):
    config = config_factory()
    out = discover(config)
    assert Manifest.read(out) is not None
    cat = _catalog(out)
    assert cat["sharegpt"]["rows"] == 200 and cat["sharegpt"]["format"] == "sharegpt"
    assert cat["ultrachat"]["format"] == "messages" and cat["local_qa"]["format"] == "columns"
    assert cat["pretokenized"]["format"] == "pretokenized" and cat["pretokenized"]["rows"] == 20
    assert all(f["bytes"] > 0 for d in cat.values() for f in d["files"])
    assert discover(config) == out  # second run: manifest hit


def test_format_that_does_not_fit_the_adapter_is_an_error_naming_the_fix(
    config_factory, data_world
):
    path = data_world["data"] / "ultrachat.parquet"
    config = config_factory([f"sources=[{{adapter: opencodeinstruct, path: '{path}'}}]"])
    with pytest.raises(DiscoveryError, match=r"opencodeinstruct.*columns"):
        discover(config)


def test_missing_local_path_names_the_source(config_factory, tmp_path):
    config = config_factory(
        [f"sources=[{{adapter: jsonl, name: mine, path: '{tmp_path / 'nope.jsonl'}'}}]"]
    )
    with pytest.raises(DiscoveryError, match=r"'mine'.*path"):
        discover(config)


def _good_parquet(path: Path) -> bytes:
    pq.write_table(pa.table({"conversations": ['[{"from": "human", "value": "hi"}]'] * 50}), path)
    return path.read_bytes()


BAD_FILES = {  # file name -> (bytes, what the one line says)
    "empty.parquet": (lambda p: b"", "empty file"),
    "cut.parquet": (lambda p: _good_parquet(p)[:-40], "not a readable Parquet file"),
    "empty.json": (lambda p: b"", "empty file"),
    "empty.jsonl": (lambda p: b"", "empty file"),
    "prose.json": (lambda p: b"Once upon a time, not JSON.\n", "does not start with readable rows"),
    "utf16.json": (lambda p: '[{"conversations": []}]'.encode("utf-16"), "UTF-16/32, not UTF-8"),
    "utf16-nobom.jsonl": (
        lambda p: '{"conversations": []}'.encode("utf-16-le"),
        "UTF-16/32, not UTF-8",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_an_unreadable_source_file_is_refused_in_one_line_naming_it(name, config_factory, tmp_path):
    path = tmp_path / name
    make, what = BAD_FILES[name]
    path.write_bytes(make(path))
    adapter = "parquet" if name.endswith(".parquet") else "sharegpt"
    config = config_factory(
        [f"sources=[{{adapter: {adapter}, path: '{path}'}}]"], root=tmp_path / "run"
    )
    with pytest.raises(DiscoveryError) as failure:
        discover(config)
    message = str(failure.value)
    assert str(path) in message and what in message and "\n" not in message


def _fake_hub_cache(home: Path) -> Path:
    """The HF cache layout: datasets--owner--name/{refs/main, snapshots/<sha>/...}."""
    repo = home / "hub" / "datasets--tiny-org--tiny-chat"
    snap = repo / "snapshots" / SHA
    (snap / "data").mkdir(parents=True)
    turns = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    for split, n in (("train", 7), ("test", 3)):
        msgs = [[{"role": "user", "content": f"{split} question {i}"}] for i in range(n)]
        pq.write_table(
            pa.table({"messages": pa.array(msgs, type=turns)}),
            snap / "data" / f"{split}-00000-of-00001.parquet",
        )
    (snap / "README.md").write_text("---\nlicense: mit\n---\n# tiny\n")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    return snap


def test_hub_dataset_resolves_offline_from_the_hf_cache(config_factory, tmp_path, monkeypatch):
    home = tmp_path / "hf"
    _fake_hub_cache(home)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = config_factory(
        [
            "gate.prompt_sets={}",
            "sources=[{adapter: ultrachat, hub_id: tiny-org/tiny-chat, split: train}]",
        ]
    )
    record = _catalog(discover(config))["ultrachat"]
    assert record["kind"] == "hub" and record["revision"] == SHA and record["license"] == "mit"
    assert record["rows"] == 7 and [Path(f["path"]).name for f in record["files"]] == [
        "train-00000-of-00001.parquet"
    ]
    stats = Manifest.read(normalize(config)).stats["sources"]["ultrachat"]
    assert stats["kept"] == 7


def test_uncached_hub_dataset_offline_names_the_dataset_and_the_fix(
    config_factory, tmp_path, monkeypatch
):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = config_factory(["sources=[{adapter: tulu3}]"])
    with pytest.raises(HubError) as err:
        discover(config)
    text = str(err.value)
    assert "allenai/tulu-3-sft-mixture" in text and "HF_HUB_OFFLINE" in text and "path" in text


def test_split_files_pick_the_split_and_config(tmp_path):
    names = [
        "data/train_sft-0.parquet",
        "data/test_sft-0.parquet",
        "7M/train-0.parquet",
        "Gen/train-0.parquet",
    ]
    files = [tmp_path / n for n in names]
    assert split_files(files[:2], tmp_path, split="train_sft", subset=None) == [files[0]]
    assert split_files(files[2:], tmp_path, split="train", subset="7M") == [files[2]]
    assert split_files([tmp_path / "all.json"], tmp_path, split="train", subset=None) == [
        tmp_path / "all.json"
    ]


def test_hub_search_filters_by_rows_and_license_and_ranks_by_popularity():
    records = json.loads((FIXTURES / "hub_list_datasets.json").read_text())
    got = rank_candidates(records, min_rows=500_000, licenses=["apache-2.0", "mit"])
    ids = [c["id"] for c in got]
    # smoltalk: log10(21001) + 0.5 log10(381) = 5.61 > perfectblend 4.72 + 0.86 = 5.58 > SlimOrca
    # 4.82
    assert ids == ["HuggingFaceTB/smoltalk", "mlabonne/open-perfectblend", "Open-Orca/SlimOrca"]
    assert got[0]["format"] == "messages" and got[1]["format"] == "sharegpt"
    assert all(c["license"] in ("apache-2.0", "mit") and c["rows_high"] >= 500_000 for c in got)
