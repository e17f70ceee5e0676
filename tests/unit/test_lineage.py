"""What regen reads (``eagle3.lineage``): the prompts stage under ``uniform``, the aimed nights'
selection under ``aimed``, for the nightly flow and for a re-trigger of chosen shards alike."""

from __future__ import annotations

import pytest

from eagle3.config.pipeline import with_overrides
from eagle3.lineage import Lineage
from eagle3.regen.plan import regen_dir_for
from eagle3.regen.stage import RegenStage
from eagle3.rundir.layout import PLAN_FILE, REGEN_INPUT, StageInputError
from eagle3.scaling.night import plan_tonight


def test_a_regen_retrigger_reads_what_the_night_read_under_either_policy(
    tiny_config, tmp_path, write_prompt_pool
):
    uniform = with_overrides(tiny_config, [f"root={tmp_path}", "normalize.shard_size=10"])
    aimed = with_overrides(uniform, ["scaling.policy=aimed", "scaling.eval_per_domain=2"])
    prompts = write_prompt_pool(Lineage(uniform).stage_dir("normalize"), {"chat": 30, "math": 30})
    # the scaling section does not change the prompts
    assert Lineage(aimed).stage_dir("normalize") == prompts
    night = plan_tonight(aimed, prompts, 24)

    assert Lineage(uniform).input(REGEN_INPUT) == prompts
    assert str(Lineage(aimed).input(REGEN_INPUT)) == night.select_dir
    assert Lineage(aimed).stage_dir("regen") == regen_dir_for(
        aimed, Lineage(aimed).input(REGEN_INPUT)
    )
    assert Lineage(aimed).stage_dir("regen") != Lineage(uniform).stage_dir("regen")

    # what the regen deployment's `shard_ids` re-trigger plans (tasks.stage.plan_task)
    stage = RegenStage()
    plan = stage.plan(aimed, **Lineage(aimed).resolve_inputs(stage.inputs, {"shard_ids": [1]}))
    assert str(plan.prompts_dir) == night.select_dir and plan.units == (1,)
    assert (
        plan.out_dir == Lineage(aimed).stage_dir("regen") and sorted(plan.shards) == night.shard_ids
    )


def test_a_command_given_no_features_takes_this_configs_decision_and_names_what_to_run_first(
    tiny_config, tmp_path
):
    online = with_overrides(tiny_config, [f"root={tmp_path}", "train.features=online"])
    lineage = Lineage(online)
    with pytest.raises(StageInputError, match="eagle3 regen"):
        lineage.features()  # online needs the planned regen stage
    regen = lineage.stage_dir("regen")
    regen.mkdir(parents=True)
    (regen / PLAN_FILE).write_text("{}")
    source = lineage.features()
    assert (
        source.online
        and source.regen_dir == regen
        and source.features_dir == lineage.stage_dir("capture")
    )
    with pytest.raises(StageInputError, match="eagle3 capture"):
        # stored needs finished features
        Lineage(with_overrides(online, ["train.features=stored"])).features()
