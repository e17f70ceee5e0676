"""The one input rule: without explicit paths, `eagle3 train` and `eagle3 vocab` read the features
stage that their config names (never the newest one), and with no match the error lists what exists
and how to point at it."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from eagle3.capture.stage import CaptureStage
from eagle3.config.pipeline import with_overrides
from eagle3.lineage import Lineage
from eagle3.rundir.runroot import Manifest
from eagle3.stage import run_stage

OVERRIDES = ["vocab.draft_vocab_size=64"]


def _capture(config, regen: Path) -> Path:
    """A finished features stage of ``config`` over ``regen``, built with the library."""
    return run_stage(CaptureStage(), config, regen_dir=regen).out_dir


@pytest.fixture(scope="module")
def two_features(tiny_config, write_regen_stage, tmp_path_factory):
    """One run root, one regen stage, two features stages from two configs; the *other* config's is
    newer."""
    root = tmp_path_factory.mktemp("input-rule")
    ours = with_overrides(tiny_config, [f"root={root}", *OVERRIDES])
    theirs = with_overrides(ours, ["capture.max_seq_len=200"])
    regen = write_regen_stage(Lineage(ours).stage_dir("regen"), shards=1, rows=4)
    assert Lineage(theirs).stage_dir("regen") == regen  # the capture setting changes features only
    mine = _capture(ours, regen)
    other = _capture(theirs, regen)
    os.utime(other / "manifest.json", (mine.stat().st_mtime + 60,) * 2)
    return root, mine, other


def _cli(*args: str):
    from flows.cli import app

    return CliRunner().invoke(app, list(args))


def test_train_and_vocab_read_the_features_stage_their_config_names(two_features, monkeypatch):
    root, mine, _other = two_features
    sets = ["--set", f"root={root}", *(x for o in OVERRIDES for x in ("--set", o))]
    result = _cli("vocab", *sets)
    assert result.exit_code == 0, result.output
    vocab = Path(result.stdout.strip().splitlines()[-1])
    assert Manifest.read(vocab.parent).config["features"] == str(mine)

    calls = []
    monkeypatch.setattr(
        "flows.train.train_flow",
        lambda config, features, vocab: (
            calls.append((str(features.features_dir), vocab)) or SimpleNamespace(export="x")
        ),
    )
    result = _cli("train", *sets)
    assert result.exit_code == 0, result.output
    assert calls == [(str(mine), str(vocab))]


def test_without_a_matching_stage_the_error_lists_what_exists(two_features):
    root, mine, other = two_features
    result = _cli("vocab", "--set", f"root={root}", "--set", "capture.max_seq_len=300")
    assert result.exit_code == 2
    assert (
        str(mine) in result.output and str(other) in result.output and "--features" in result.output
    )


def test_an_explicit_path_wins_and_must_be_finished(two_features, tiny_config, tmp_path):
    from eagle3.rundir.layout import StageInputError

    root, _mine, other = two_features
    lineage = Lineage(with_overrides(tiny_config, [f"root={root}", *OVERRIDES]))
    assert lineage.input("capture", other) == other
    with pytest.raises(StageInputError, match="not a finished capture stage"):
        lineage.input("capture", tmp_path)
