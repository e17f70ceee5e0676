"""The shim's guards: the pinned SGLang version, and torchvision's two fake registrations."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from eagle3.serve.sglang_cpu import SGLANG_VERSION, shim


def _installed(version: str | None):
    def fake(name: str) -> str:
        assert name == "sglang"
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return version

    return fake


def test_check_version_accepts_the_pinned_release(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", _installed(SGLANG_VERSION))

    assert shim.check_version() == SGLANG_VERSION


@pytest.mark.parametrize("found", ["0.5.22", "0.6.0", None])
def test_check_version_refuses_any_other_release_in_one_line_naming_the_install(monkeypatch, found):
    monkeypatch.setattr(importlib.metadata, "version", _installed(found))

    with pytest.raises(shim.RuntimeMismatch) as raised:
        shim.check_version()

    message = str(raised.value)
    assert "\n" not in message and "bash infra/dev.sh sglang" in message
    assert (found or "no SGLang") in message


_REGISTER_FAKES = """
import torch
{guard}
for name in ("nms", "qnms"):  # what torchvision/_meta_registrations.py does at import
    torch.library.register_fake("torchvision::" + name)(lambda dets, scores, iou_threshold: dets.new_empty(0))
print(torch.ops.torchvision.nms.default._schema)
"""


@pytest.mark.parametrize("guarded", [False, True])
def test_torchvision_fake_registrations_need_the_guard_when_its_ops_did_not_load(guarded):
    guard = (
        "from eagle3.serve.sglang_cpu.shim import _guard_torchvision; _guard_torchvision()"
        if guarded
        else ""
    )
    run = subprocess.run(
        [sys.executable, "-c", _REGISTER_FAKES.format(guard=guard)],
        capture_output=True,
        text=True,
        timeout=300,
    )

    if guarded:
        assert run.returncode == 0, run.stderr
        assert (
            "torchvision::nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
            in run.stdout
        )
    else:
        assert run.returncode != 0 and "torchvision::nms does not exist" in run.stderr
