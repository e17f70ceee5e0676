"""The arms the gate launches side by side: SGLang arms split the device's memory, the shipped line
keeps the config's."""

from __future__ import annotations

from eagle3.config.pipeline import with_overrides
from eagle3.gate.release import _plan


def test_sglang_arms_up_together_split_the_device_memory_but_ship_the_configured_line(
    bench_config, make_export
):
    draft = make_export()
    sglang = with_overrides(bench_config, ["server.engine=sglang"])
    plan = _plan(sglang, [draft], None, baseline_url=None, spec_url=None, champion_url=None)
    assert [a.role for a in plan.arms] == ["baseline", "candidate"]
    for arm in plan.arms:
        # 0.85 over two arms, the same for both
        assert "--mem-fraction-static 0.425" in str(arm.launch_used)
        assert "--mem-fraction-static" not in str(arm.launch_sglang)
    pinned = with_overrides(sglang, ["server.mem_fraction_static=0.3"])
    plan = _plan(pinned, [draft], None, baseline_url=None, spec_url=None, champion_url=None)
    assert all("--mem-fraction-static 0.3" in str(a.launch_used) for a in plan.arms)
