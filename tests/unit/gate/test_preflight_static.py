"""Static preflight: one test per check, each on an export or launch pair broken in exactly that
way."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import torch

from eagle3.config.pipeline import PipelineConfig, with_overrides
from eagle3.data.parquet import write_table
from eagle3.gate.preflight import Check, failed, run_static
from eagle3.serve.launch_commands import LaunchCommand, build_launch


def _static(
    config: PipelineConfig, export: Path, *, features: Path | None = None, spec_config=None
) -> list[Check]:
    baseline = build_launch(config, "baseline", engine="sglang", port=30000)
    spec = build_launch(spec_config or config, "eagle3", engine="sglang", draft=export, port=30000)
    return run_static(config, export, baseline=baseline, spec=spec, features_dir=features)


def _failures(checks: list[Check]) -> dict[str, str]:
    return {c.name: c.message for c in failed(checks)}


def test_good_export_and_launch_pair_pass_every_static_check(bench_config, make_export):
    checks = _static(bench_config, make_export())
    assert _failures(checks) == {}
    assert {c.name for c in checks} >= {
        "algorithm",
        "arms_match",
        "draft_path",
        "architecture",
        "draft_keys",
        "fc_shape",
        "draft_shapes",
        "draft_vocab",
        "d2t_order",
        "layer_ids",
        "tie_word_embeddings",
        "max_position_embeddings",
        "tp_heads",
    }


def test_eagle_algorithm_fails_naming_the_flag_and_the_fix(bench_config, make_export):
    eagle = with_overrides(bench_config, ["speculative.algorithm=EAGLE"])
    fails = _failures(_static(bench_config, make_export(), spec_config=eagle))
    assert set(fails) == {"algorithm"}
    assert "--speculative-algorithm is 'EAGLE'" in fails["algorithm"]
    assert "speculative.algorithm=EAGLE3" in fails["algorithm"]


def test_fc_of_single_hidden_width_fails_fc_shape(bench_config, make_export):
    def narrow_fc(cfg, tensors):
        tensors["fc.weight"] = torch.zeros(128, 128)

    fails = _failures(_static(bench_config, make_export(mutate=narrow_fc)))
    assert set(fails) == {"fc_shape"}
    assert "[128, 384]" in fails["fc_shape"]


def test_missing_key_fails_draft_keys(bench_config, make_export):
    export = make_export(mutate=lambda cfg, t: t.pop("midlayer.hidden_norm.weight"))
    fails = _failures(_static(bench_config, export))
    assert set(fails) == {"draft_keys"}
    assert "missing ['midlayer.hidden_norm.weight']" in fails["draft_keys"]


def test_extra_key_fails_draft_keys(bench_config, make_export):
    def add_embed(cfg, tensors):
        tensors["embed_tokens.weight"] = torch.zeros(2048, 128)

    fails = _failures(_static(bench_config, make_export(mutate=add_embed)))
    assert set(fails) == {"draft_keys"}
    assert "extra ['embed_tokens.weight']" in fails["draft_keys"]


def test_d2t_of_wrong_length_fails_draft_vocab(bench_config, make_export):
    def short_d2t(cfg, tensors):
        tensors["d2t"] = tensors["d2t"][:-1]

    fails = _failures(_static(bench_config, make_export(mutate=short_d2t)))
    assert "draft_vocab" in fails and "len(d2t) 511" in fails["draft_vocab"]


def test_d2t_out_of_order_fails_d2t_order(bench_config, make_export):
    def swap(cfg, tensors):
        targets = torch.arange(512) + tensors["d2t"]
        targets[[3, 4]] = targets[[4, 3]]
        tensors["d2t"] = targets - torch.arange(512)

    fails = _failures(_static(bench_config, make_export(mutate=swap)))
    assert set(fails) == {"d2t_order"}
    assert "strictly increasing" in fails["d2t_order"]


def test_d2t_outside_the_vocab_fails_d2t_order(bench_config, make_export):
    def overflow(cfg, tensors):
        tensors["d2t"] = tensors["d2t"].clone()
        tensors["d2t"][-1] = 5000

    fails = _failures(_static(bench_config, make_export(mutate=overflow)))
    assert "outside the vocab" in fails["d2t_order"]


def test_lm_head_rows_off_fail_draft_vocab(bench_config, make_export):
    def rows(cfg, tensors):
        tensors["lm_head.weight"] = torch.zeros(500, 128)

    fails = _failures(_static(bench_config, make_export(mutate=rows)))
    assert "lm_head rows 500" in fails["draft_vocab"]


def _features(tmp_path: Path, ids: list[int], convention: str) -> Path:
    out = tmp_path / "features" / "fp"
    table = pa.table({"sample_id": ["a"]})
    meta = {"layer_ids": json.dumps(ids), "layer_convention": convention}
    write_table(out / "shard-00000.parquet", table, metadata=meta)
    return out


def test_layer_ids_in_the_wrong_convention_disagree_with_the_capture_footer(
    bench_config, make_export, tmp_path
):
    features = _features(tmp_path, [2, 4, 5], "input_of_layer")
    good = make_export("good")
    assert "layer_ids" not in _failures(_static(bench_config, good, features=features))
    wrong = make_export(
        "wrong",
        eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5], "use_aux_hidden_state": True},
    )
    fails = _failures(_static(bench_config, wrong, features=features))
    assert set(fails) == {"layer_ids"}
    assert "eagle_aux_hidden_state_layer_ids=[1, 3, 4]" in fails["layer_ids"]


def test_layer_ids_of_an_output_convention_capture_are_converted(
    bench_config, make_export, tmp_path
):
    features = _features(tmp_path, [1, 3, 4], "output_of_layer")
    assert _failures(_static(bench_config, make_export(), features=features)) == {}


def test_layer_ids_are_checked_by_the_target_familys_sglang_rule(bench_config, make_export):
    """Ids [2, 4, 5] on a capture of [2, 4, 5]: Llama's SGLang path serves [3, 5, 6]; DeepSeek's
    serves them verbatim (first id is not 1), so the same export fails on one family and passes on
    the other."""
    verbatim = make_export(
        "verbatim",
        eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5], "use_aux_hidden_state": True},
    )
    llama = _failures(_static(bench_config, verbatim))
    assert set(llama) == {"layer_ids"} and "input_of_layer [3, 5, 6]" in llama["layer_ids"]
    deepseek = with_overrides(bench_config, ["target.family=deepseek"])
    assert _failures(_static(deepseek, verbatim, spec_config=deepseek)) == {}
    assert _failures(_static(deepseek, make_export(), spec_config=deepseek)) == {}


def test_absent_or_two_layer_ids_fail(bench_config, make_export):
    absent = make_export("absent", eagle_config={"use_aux_hidden_state": True})
    two = make_export(
        "two",
        eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3], "use_aux_hidden_state": True},
    )
    for export in (absent, two):
        fails = _failures(_static(bench_config, export))
        assert set(fails) == {"layer_ids"}
        assert "never rely on SGLang's default" in fails["layer_ids"]


def test_tied_word_embeddings_fail(bench_config, make_export):
    fails = _failures(_static(bench_config, make_export(tie_word_embeddings=True)))
    assert set(fails) == {"tie_word_embeddings"}


def test_max_position_embeddings_below_served_context_fails(bench_config, make_export):
    fails = _failures(_static(bench_config, make_export(max_position_embeddings=512)))
    assert set(fails) == {"max_position_embeddings"}
    assert "512 < served context 1024" in fails["max_position_embeddings"]


def test_heads_not_divisible_by_tp_fail(bench_config, make_export):
    tp3 = with_overrides(bench_config, ["server.tp=3"])
    fails = _failures(_static(tp3, make_export(), spec_config=tp3))
    assert set(fails) == {"tp_heads"}
    assert "tp=3" in fails["tp_heads"]


def test_arms_differing_beyond_speculative_flags_fail(bench_config, make_export):
    longer = with_overrides(
        bench_config, ["server.context_length=2048", "server.mem_fraction_static=0.8"]
    )
    fails = _failures(_static(bench_config, make_export(), spec_config=longer))
    assert set(fails) == {"arms_match"}
    assert "'--mem-fraction-static'" in fails["arms_match"]


def test_speculative_arm_without_a_batch_limit_fails(bench_config, make_export):
    export = make_export()
    spec = build_launch(bench_config, "eagle3", engine="sglang", draft=export, port=30000)
    at = spec.argv.index("--max-running-requests")
    uncapped = LaunchCommand(
        spec.arm, spec.engine, spec.argv[:at] + spec.argv[at + 2 :], spec.host, spec.port
    )
    baseline = build_launch(bench_config, "baseline", engine="sglang", port=30000)
    fails = _failures(run_static(bench_config, export, baseline=baseline, spec=uncapped))
    assert set(fails) == {"arms_match"}
    assert "caps it at 48" in fails["arms_match"]


def test_missing_export_is_a_failed_check_not_a_crash(bench_config, tmp_path):
    fails = _failures(_static(bench_config, tmp_path / "nowhere"))
    assert "export_files" in fails and "config.json is missing" in fails["export_files"]
