"""Capture backends register by name: unknown names list the known ones, duplicates are errors."""

from __future__ import annotations

import pytest

from eagle3.capture.backends import get_backend, known_backends, register_backend


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(KeyError, match=r"unknown capture backend 'sglang-typo'.*\['hf'"):
        get_backend("sglang-typo")


def test_registering_a_name_twice_is_an_error():
    assert "hf" in known_backends()
    with pytest.raises(ValueError, match="already registered"):
        register_backend("hf")(lambda config: None)


def test_hf_backend_is_found_by_name():
    from eagle3.capture.hf import load_hf_backend

    assert get_backend("hf").__name__ == "_hf_factory"
    assert callable(load_hf_backend)
