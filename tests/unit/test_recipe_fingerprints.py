"""Golden file of what every recipe resolves to: the config, the values ``eagle3 config show``
derives from it, and every stage's fingerprint. A refactor that moves a default, a recipe value or a
fingerprint (and with it every cached stage directory of every run root) is a visible diff here.

Regenerate with ``EAGLE3_UPDATE_GOLDEN=1 pytest tests/unit/test_recipe_fingerprints.py`` (only when
the change is meant to move them; say so in the commit).

Machine independence: recipes resolve their paths from ``EAGLE3_HOME``, and several fingerprints
hash those paths (the gate prompt sets in the prompts fingerprint), so the test resolves every
recipe under one fixed home that does not exist. Nothing is then read from or built into the
machine's tiny worlds (their trained weights and tokenizers differ per machine, and a recipe only
names its world's directory, by the spec's fingerprint, without building it). What cannot be
computed the same way everywhere is fed a fixed placeholder instead, each said where it is done.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from eagle3.recipes import RECIPES, load_recipe

GOLDEN = Path(__file__).parent / "golden" / "recipe_fingerprints.json"
# never created: a recipe that reads or builds its world here fails the test
HOME = "/eagle3-golden-home"


def _placeholder(stage: str) -> str:
    return f"<{stage} fingerprint placeholder>"


def recipe_record(name: str) -> dict[str, Any]:
    """The resolved config of recipe ``name`` (JSON), what ``config show`` derives from it, and each
    stage's fingerprint, each computed from the config and its upstream stage's fingerprint as in
    ``eagle3.lineage``."""
    from eagle3.capture.budget import night_estimate
    from eagle3.capture.shard import features_fingerprint
    from eagle3.data import normalize
    from eagle3.gate.release import gate_fingerprint
    from eagle3.regen.plan import regen_fingerprint
    from eagle3.scaling.selection import select_fingerprint
    from eagle3.train.identity import draft_fingerprint
    from eagle3.train.vocab import vocab_fingerprint

    config = load_recipe(name)
    # catalog: hashes each local file's path, size and mtime, or asks the Hub for a dataset's
    # revision: a cache key of this machine's files by design, so the chain starts from a
    # placeholder.
    catalog_fp = _placeholder("catalog")
    prompts_fp = normalize.prompts_fingerprint(config, catalog_fp)
    select_fp = select_fingerprint(config, prompts_fp)
    regen_fp = regen_fingerprint(
        select_fp if config.scaling.policy == "aimed" else prompts_fp, config
    )
    features_fp = features_fingerprint(config, regen_fp)
    # vocab and draft key on the finished features directory's shard checksums
    # (``feature_set_fingerprint``): content, not config, so a placeholder stands for it.
    vocab_fp = vocab_fingerprint(config, _placeholder("feature set"))
    draft_fp = draft_fingerprint(config, _placeholder("feature set"), vocab_fp)
    fingerprints = {
        "prompts": prompts_fp,
        "select": select_fp,
        "regen": regen_fp,
        "features": features_fp,
        "vocab": vocab_fp,
        "draft": draft_fp,
        # drafts are named by their exported files' hashes (``draft_id``): no draft, no champion, no
        # given URL.
        "gate": gate_fingerprint(config, [], None, {}),
    }
    # ``capture_memory_per_gpu`` (``served_plan``) is left out: it reads the checkpoint's headers
    # from the Hub.
    derived = {**config.derived(), "capture_disk_per_night": night_estimate(config)}
    return {
        "config": config.model_dump(mode="json"),
        "derived": derived,
        "fingerprints": fingerprints,
    }


def world_dirs() -> dict[str, str]:
    """The directory names of the dev worlds' default specs (their fingerprints, which name every
    cached world)."""
    from eagle3.worlds.domains_world import DomainsWorldSpec
    from eagle3.worlds.think_world import ThinkWorldSpec
    from eagle3.worlds.world import TinyWorldSpec, world_dir_for

    return {
        "tiny": world_dir_for(Path(HOME), TinyWorldSpec()).name,
        "think": world_dir_for(Path(HOME), ThinkWorldSpec()).name,
        "domains": f"domains-world-{DomainsWorldSpec().fingerprint()}",
    }


@pytest.fixture
def golden_home(monkeypatch):
    monkeypatch.setenv("EAGLE3_HOME", HOME)
    # The prompts fingerprint hashes the target tokenizer (vocabulary, merges, chat template): the
    # tiny worlds' is trained on each machine and the large recipes' comes from the Hub. Its own
    # identity is tested with the data stage; here it is a constant, so the rest of the prompts
    # fingerprint (sources, mix, normalize, gate sets) is.
    from eagle3.data import normalize

    monkeypatch.setattr(normalize, "tokenizer_identity", lambda config: _placeholder("tokenizer"))
    return HOME


def test_every_recipe_resolves_to_its_golden_config_and_stage_fingerprints(golden_home):
    assert not Path(golden_home).exists(), (
        f"{golden_home} must not exist: the golden file assumes no world there"
    )
    got = {
        "recipes": {name: recipe_record(name) for name in sorted(RECIPES)},
        "worlds": world_dirs(),
    }
    if os.environ.get("EAGLE3_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert GOLDEN.exists(), f"{GOLDEN} missing: run with EAGLE3_UPDATE_GOLDEN=1 to create it"
    want = json.loads(GOLDEN.read_text())
    assert sorted(got["recipes"]) == sorted(want["recipes"]), (
        "a recipe was added or removed: regenerate the golden"
    )
    for name, record in got["recipes"].items():
        for part in ("config", "derived", "fingerprints"):
            assert record[part] == want["recipes"][name][part], f"recipe {name}: its {part} moved"
    assert got["worlds"] == want["worlds"], (
        "a dev world's spec fingerprint moved (every cached world is rebuilt)"
    )
    assert not Path(golden_home).exists(), "resolving a recipe must not build or write anything"
