"""What regen reads (``eagle3.lineage``): the prompts stage under ``uniform``, the aimed nights' selection under
``aimed``, for the nightly flow and for a re-trigger of chosen shards alike."""

from __future__ import annotations

from eagle3.config.pipeline import with_overrides
from eagle3.lineage import Lineage
from eagle3.regen.plan import regen_dir_for
from eagle3.regen.stage import RegenStage
from eagle3.rundir.layout import REGEN_INPUT
from eagle3.scaling.night import plan_tonight


def test_a_regen_retrigger_reads_what_the_night_read_under_either_policy(tiny_config, tmp_path, write_prompt_pool):
    uniform = with_overrides(tiny_config, [f"root={tmp_path}", "normalize.shard_size=10"])
    aimed = with_overrides(uniform, ["scaling.policy=aimed", "scaling.eval_per_domain=2"])
    prompts = write_prompt_pool(Lineage(uniform).stage_dir("normalize"), {"chat": 30, "math": 30})
    assert Lineage(aimed).stage_dir("normalize") == prompts  # the scaling section does not change the prompts
    night = plan_tonight(aimed, prompts, 24)

    assert Lineage(uniform).input(REGEN_INPUT) == prompts
    assert str(Lineage(aimed).input(REGEN_INPUT)) == night.select_dir
    assert Lineage(aimed).stage_dir("regen") == regen_dir_for(aimed, Lineage(aimed).input(REGEN_INPUT))
    assert Lineage(aimed).stage_dir("regen") != Lineage(uniform).stage_dir("regen")

    stage = RegenStage()  # what the regen deployment's `shard_ids` re-trigger plans (tasks.stage.plan_task)
    plan = stage.plan(aimed, **Lineage(aimed).resolve_inputs(stage.inputs, {"shard_ids": [1]}))
    assert str(plan.prompts_dir) == night.select_dir and plan.units == (1,)
    assert plan.out_dir == Lineage(aimed).stage_dir("regen") and sorted(plan.shards) == night.shard_ids
