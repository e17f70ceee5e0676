"""The gate's config section (``eagle3.config.gate``): the traffic profile, and the removed keys
refused at load with the ``gate.traffic`` that replaces them."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3.config.base import ConfigError
from eagle3.config.pipeline import load_yaml
from eagle3.recipes import load_recipe


def test_the_profile_is_sorted_and_its_shares_sum_to_one():
    gate = load_recipe("tiny", ["gate.traffic={16: 1, 1: 2, 4: 1}"]).gate
    assert gate.levels == [1, 4, 16]
    assert gate.shares == {1: 0.5, 4: 0.25, 16: 0.25}


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (
            ["gate.concurrency=[1, 4, 16]", "gate.decision_concurrency=4"],
            r"gate\.concurrency and gate\.decision_concurrency were replaced by gate\.traffic.*"
            r"set gate\.traffic=\{1: 0, 4: 1, 16: 0\} to decide as before",
        ),
        (
            ["gate.decision_concurrency=1"],
            r"gate\.decision_concurrency was replaced by gate\.traffic.*remove "
            r"gate\.decision_concurrency",
        ),
    ],
)
def test_the_removed_keys_fail_at_load_naming_the_traffic_that_replaces_them(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_recipe("tiny", overrides)


def test_a_yaml_file_with_the_old_keys_fails_the_same_way(tmp_path: Path):
    path = tmp_path / "old.yaml"
    yaml = load_recipe("tiny").to_yaml()
    path.write_text(yaml.replace("\n  traffic:\n", "\n  concurrency: [1, 4]\n  traffic:\n"))
    with pytest.raises(ConfigError, match=r"gate\.concurrency was replaced by gate\.traffic"):
        load_yaml(path)


@pytest.mark.parametrize(
    ("traffic", "needle"),
    [
        ("{}", "is empty"),
        ("{1: 0, 4: 0}", "weighs every level 0"),
        ("{0: 1}", "concurrencies must be >= 1"),
        ("{1: -1}", "weights >= 0"),
    ],
)
def test_a_profile_that_weighs_nothing_or_has_bad_levels_is_refused(traffic, needle):
    with pytest.raises(ConfigError, match=needle):
        load_recipe("tiny", [f"gate.traffic={traffic}"])


def test_the_profile_survives_the_yaml_round_trip(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text(load_recipe("tiny", ["gate.traffic={1: 3, 8: 1}"]).to_yaml())
    assert load_yaml(path).gate.traffic == {1: 3.0, 8: 1.0}


def test_the_gate_samples_greedily_unless_told_and_overrides_add_a_sampled_profile():
    gate = load_recipe("llama3_8b").gate
    assert list(gate.sampling) == ["greedy"] and gate.sampling["greedy"].greedy
    override = "gate.sampling.served={temperature: 1.0, top_p: 0.95, decides: false}"
    served = load_recipe("llama3_8b", [override])
    profile = served.gate.sampling["served"]
    assert profile.label() == "T=1 top_p=0.95" and not profile.decides
    assert profile.request() == {"temperature": 1.0, "top_p": 0.95, "top_k": -1}


def test_a_greedy_gate_keeps_its_fingerprint_and_any_other_sampling_moves_it():
    from eagle3.gate.release import gate_fingerprint

    def fp(overrides):
        return gate_fingerprint(load_recipe("llama3_8b", overrides), [], None, {})

    greedy = load_recipe("llama3_8b").gate
    assert "sampling" not in greedy.identity()  # the fields every gate hashed before profiles
    assert fp([]) == fp(["gate.sampling={greedy: {}}"])
    moved = [
        ["gate.sampling={served: {temperature: 1.0}}"],
        ["gate.sampling.served={temperature: 1.0, decides: false}"],
    ]
    assert len({fp([]), *(fp(o) for o in moved)}) == 1 + len(moved)


def test_a_profiles_own_levels_decide_its_verdict():
    override = "gate.sampling.served={temperature: 0.7, traffic: {4: 1, 1: 3}}"
    gate = load_recipe("llama3_8b", [override]).gate
    assert gate.for_sampling("served").shares == {1: 0.75, 4: 0.25}
    assert gate.for_sampling("greedy").levels == gate.levels


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("gate.sampling={}", r"gate\.sampling is empty"),
        ("gate.sampling={g: {decides: false}}", r"no gate\.sampling profile decides: set"),
        ("gate.sampling={g: {top_k: 0}}", r"top_k must be -1 \(every token\) or at least 1"),
        ("gate.sampling={g: {temperature: -1}}", r"temperature"),
        ("gate.sampling={g: {top_p: 0}}", r"top_p"),
        ("gate.sampling={g: {traffic: {0: 1}}}", r"gate\.sampling\.g\.traffic \{0: 1\.0\}: conc"),
        ("gate.sampling={g: {sets: {poetry: {}}}}", r"gate\.sampling\.g\.sets names \['poetry'\]"),
    ],
)
def test_a_bad_sampling_profile_fails_at_load_naming_the_fix(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_recipe("llama3_8b", [override])


def test_request_seeds_are_stable_and_differ_by_prompt_round_and_profile_seed():
    from eagle3.config.sampling import SamplingProfile

    profile = SamplingProfile(temperature=1.0)
    seeds = {profile.request_seed(p, r) for p in ("a", "b") for r in (0, 1)}
    assert len(seeds) == 4 and all(0 <= s < 2**63 for s in seeds)
    assert profile.request_seed("a", 0) == SamplingProfile(temperature=0.5).request_seed("a", 0)
    reseeded = SamplingProfile(temperature=1.0, seed=1)
    assert profile.request_seed("a", 0) != reseeded.request_seed("a", 0)
    assert profile.request_seed("a", 0) == 4966817861088978073  # sha256: the same on every machine
