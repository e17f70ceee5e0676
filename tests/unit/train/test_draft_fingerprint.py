"""The draft stage's fingerprint: keys added to ``train`` (the EAGLE 3.1 architecture, the LK
losses) leave every existing recipe's fingerprint as it was while at their defaults, and change it
when set; operational and start fields never enter it; the config's field declarations say which is
which."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel, Field

from eagle3.config.train import ADDED, OPERATIONAL, START, TrainConfig
from eagle3.recipes import load_recipe
from eagle3.train.identity import draft_fingerprint, draft_key

# Computed by the trainer before train.architecture / train.loss existed (main at abf29d8), features
# "f", vocab "v".
BEFORE = {
    "kimi_k2_5": "b227be279cf0d20b",
    "llama3_8b": "7f54937a808cff34",
    "glm_5": "ad778bbf92bb857a",
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_recipes_keep_their_draft_fingerprint_with_the_new_keys_at_default(name):
    assert draft_fingerprint(load_recipe(name, OWN_DRAFT.get(name, [])), "f", "v") == BEFORE[name]


# kimi_k2_5's draft is MLA over the full vocab (eagle3.recipes.KIMI_DRAFT): its fingerprint moved by
# that choice alone; with the Llama head (and 32000 draft ids) it is the one above.
OWN_DRAFT = {"kimi_k2_5": ["train.architecture.attention=mha", "vocab.draft_vocab_size=32000"]}


def test_the_kimi_recipes_mla_draft_is_another_draft():
    assert draft_fingerprint(load_recipe("kimi_k2_5"), "f", "v") != BEFORE["kimi_k2_5"]


@pytest.mark.parametrize(
    "override",
    [
        "train.architecture.fc_norm=true",
        "train.architecture.norm_output=true",
        "train.architecture.norm_before_fc=true",
        "train.loss=lk_alpha",
        "train.loss=lk_lambda",
    ],
)
def test_setting_a_new_key_makes_another_draft(override):
    assert draft_fingerprint(load_recipe("kimi_k2_5", [override]), "f", "v") != BEFORE["kimi_k2_5"]


@pytest.mark.parametrize(
    "override",
    [
        "train.nproc=8",
        "train.device=cpu",
        "train.save_every=7",
        "train.keep_last=9",
        "train.log_every=2",
        "train.features=online",
        "train.online.producers=4",
        "train.replay=0.2",
        "train.champion_lr_scale=0.25",
    ],
)
def test_operational_and_start_fields_leave_a_scratch_drafts_fingerprint(override):
    config = load_recipe("kimi_k2_5", [*OWN_DRAFT["kimi_k2_5"], override])
    assert draft_fingerprint(config, "f", "v") == BEFORE["kimi_k2_5"]


def test_every_train_field_not_marked_is_in_the_fingerprint():
    marked = {
        name
        for name, field in TrainConfig.model_fields.items()
        if {OPERATIONAL, ADDED, START} & set(field.metadata)
    }
    assert set(draft_key(TrainConfig())) == set(TrainConfig.model_fields) - marked
    assert marked == {
        "nproc",
        "device",
        "save_every",
        "keep_last",
        "log_every",
        "features",
        "online",
        "architecture",
        "loss",
        "lk_kl_scale",
        "lk_kl_decay",
        "init",
        "replay",
        "champion_lr_scale",
    }


class _Section(BaseModel):
    old: bool = False
    new: Annotated[str, ADDED] = "a"


class _Train(BaseModel):
    lr: float = 1e-4
    section: _Section = Field(default_factory=_Section)
    procs: Annotated[int, OPERATIONAL] = 1


def test_a_field_added_to_a_section_stays_out_of_the_key_at_its_default():
    assert draft_key(_Train(procs=8)) == {"lr": 1e-4, "section": {"old": False}}
    assert draft_key(_Train(section=_Section(new="b"))) == {
        "lr": 1e-4,
        "section": {"old": False, "new": "b"},
    }


# An EAGLE 3.1 draft, computed before train.architecture.attention and the MLA sizes existed (main
# at 25ffde5).
EAGLE31 = ["train.architecture.fc_norm=true", "train.architecture.norm_output=true"]
EAGLE31_BEFORE = "a034fc7329cd9c61"
MLA = "train.architecture.attention=mla"


def test_an_eagle31_draft_keeps_its_fingerprint_with_the_attention_keys_at_default():
    assert draft_fingerprint(load_recipe("llama3_8b", EAGLE31), "f", "v") == EAGLE31_BEFORE


def test_an_mla_draft_and_each_of_its_sizes_make_another_draft():
    overrides = ([], [MLA], [MLA, "train.architecture.kv_lora_rank=64"])
    fps = [draft_fingerprint(load_recipe("llama3_8b", o), "f", "v") for o in overrides]
    assert len(set(fps)) == 3
