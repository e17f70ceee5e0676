"""The domains world's conversations (``eagle3.worlds.domains_world``): distinct prompts,
deterministic for a seed, and answers whose predictability differs by domain by construction (the
target is trained by the benchmark's build)."""

from __future__ import annotations

import pytest

from eagle3.worlds.domains_world import DOMAINS, DomainsWorldSpec, domain_prompts


def test_prompts_are_distinct_per_domain_and_the_same_for_a_seed():
    for domain in DOMAINS:
        convs = domain_prompts(domain, 200, seed=3)
        prompts = [c[0]["content"] for c in convs]
        assert len(set(prompts)) == 200 and convs == domain_prompts(domain, 200, seed=3)
        assert prompts != [c[0]["content"] for c in domain_prompts(domain, 200, seed=4)]


def test_each_domain_answers_in_its_own_way():
    copy = domain_prompts("copy", 20, seed=1)
    assert all(c[0]["content"].endswith(c[1]["content"]) for c in copy)  # the words, said back
    recite = {c[1]["content"] for c in domain_prompts("recite", 100, seed=1)}
    assert len(recite) == 8  # eight fixed passages, whatever the wording of the request
    codes = [c[1]["content"] for c in domain_prompts("noise", 50, seed=1, distinct=False)]
    assert len(set(codes)) == 50  # a fresh draw every time: nothing to learn
    with pytest.raises(ValueError, match="unknown domain"):
        domain_prompts("poetry", 1, seed=1)


def test_a_changed_spec_is_another_world():
    assert DomainsWorldSpec().fingerprint() == DomainsWorldSpec().fingerprint()
    assert DomainsWorldSpec(train_steps=10).fingerprint() != DomainsWorldSpec().fingerprint()
