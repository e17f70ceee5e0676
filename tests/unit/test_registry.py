"""The draft registry: champion pointer, history, content-addressed copies of promoted drafts."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagle3.errors import Stopped
from eagle3.registry import Promotion, Registry, draft_id
from eagle3.runtime.stop import request_stop, stop_on_signals


@pytest.fixture
def make_export(tmp_path: Path) -> Callable[..., Path]:
    """``make_export(name, **config)``: the two files of an export (the registry reads no more),
    its weights fixed, so two exports with the same config have the same bytes."""

    def make(name: str, **config: int) -> Path:
        out = tmp_path / name
        out.mkdir()
        (out / "config.json").write_text(json.dumps({"hidden_size": 8, **config}))
        save_file({"fc.weight": torch.ones(8, 24)}, str(out / "model.safetensors"))
        return out

    return make


def test_no_champion_before_the_first_promotion(tmp_path):
    assert Registry(tmp_path).champion() is None
    assert Registry(tmp_path).history() == []


def test_promotion_copies_the_draft_and_points_at_the_copy(tmp_path, make_export):
    export = make_export("a")
    reg = Registry(tmp_path / "root")
    promo = reg.promote(
        export, report="r.json", metrics={"speedup": 1.2}, speculative={"num_steps": 3}
    )
    champion = reg.champion()
    assert champion is not None and champion.draft_id == draft_id(export) == promo.draft_id
    assert (tmp_path / "root/registry/drafts" / promo.draft_id / "model.safetensors").exists()
    assert champion.draft_dir != str(export) and champion.metrics == {"speedup": 1.2}
    assert json.loads((tmp_path / "root/registry/promoted.json").read_text())["report"] == "r.json"
    assert not list((tmp_path / "root/registry").glob("*.tmp*"))


def test_nothing_is_promoted_once_the_run_is_stopping(tmp_path, make_export):
    first, second = make_export("a"), make_export("b", max_position_embeddings=4096)
    reg = Registry(tmp_path)
    reg.promote(first, report="1")
    with stop_on_signals():
        request_stop("SIGTERM")
        with pytest.raises(Stopped, match=r"promotion .* stopped by SIGTERM"):
            reg.promote(second, report="2")
    assert reg.champion().draft_id == draft_id(first) and [p.report for p in reg.history()] == ["1"]


def test_second_promotion_replaces_the_pointer_and_extends_history(tmp_path, make_export):
    first, second = make_export("a"), make_export("b", max_position_embeddings=4096)
    reg = Registry(tmp_path)
    reg.promote(first, report="1")
    reg.promote(second, report="2")
    assert reg.champion().draft_id == draft_id(second)
    assert [p.report for p in reg.history()] == ["1", "2"]


def test_draft_id_depends_on_content_not_path(tmp_path, make_export):
    a = make_export("a")
    b = make_export("b")  # same seed and config: identical bytes
    c = make_export("c", max_position_embeddings=4096)
    assert draft_id(a) == draft_id(b) != draft_id(c)


def test_pointer_to_a_deleted_draft_is_an_error_with_the_fix(tmp_path, make_export):
    reg = Registry(tmp_path)
    promo = reg.promote(make_export("a"), report="r")
    shutil.rmtree(promo.draft_dir)
    with pytest.raises(FileNotFoundError, match="remove the pointer"):
        reg.champion()


def test_the_pointer_reads_as_one_typed_record_even_when_its_copy_is_gone(tmp_path, make_export):
    """What the train stage reads: it refuses a missing copy in its own words
    (``eagle3.train.continual``)."""
    reg = Registry(tmp_path)
    assert reg.read_pointer() is None
    promo = reg.promote(make_export("a"), report="r", speculative={"num_steps": 3})
    assert reg.read_pointer() == reg.champion() == promo and isinstance(promo, Promotion)
    shutil.rmtree(promo.draft_dir)
    assert reg.read_pointer() == promo
