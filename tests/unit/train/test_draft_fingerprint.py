"""The draft stage's fingerprint: keys added to ``train`` (the EAGLE 3.1 architecture, the LK losses) leave every
existing recipe's fingerprint as it was while at their defaults, and change it when set."""

from __future__ import annotations

import pytest

from eagle3.recipes import load_recipe
from eagle3.train.identity import draft_fingerprint

# Computed by the trainer before train.architecture / train.loss existed (main at abf29d8), features "f", vocab "v".
BEFORE = {"kimi_k2_5": "b227be279cf0d20b", "llama3_8b": "7f54937a808cff34", "glm_5": "ad778bbf92bb857a"}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_recipes_keep_their_draft_fingerprint_with_the_new_keys_at_default(name):
    assert draft_fingerprint(load_recipe(name), "f", "v") == BEFORE[name]


@pytest.mark.parametrize("override", ["train.architecture.fc_norm=true", "train.architecture.norm_output=true",
                                      "train.architecture.norm_before_fc=true", "train.loss=lk_alpha",
                                      "train.loss=lk_lambda"])
def test_setting_a_new_key_makes_another_draft(override):
    assert draft_fingerprint(load_recipe("kimi_k2_5", [override]), "f", "v") != BEFORE["kimi_k2_5"]
