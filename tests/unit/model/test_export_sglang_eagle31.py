"""Our export read by SGLang 0.5.23 itself: ``LlamaForCausalLMEagle3`` built from the export's
``config.json`` and loaded by its own ``load_weights`` (``sglang_draft_probe.py``, in SGLang's
interpreter) takes every exported tensor, leaves no parameter unloaded but the target's
``embed_tokens``, and computes our forward's logits and next-step hidden within fp32 tolerance, for
EAGLE-3 and the EAGLE 3.1 variants. The same weights under a config without the 3.1 flags load
without an error and compute something else: the silent failure the export's key check guards."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_export_eagle31 import H, _export

import eagle3
from eagle3.model.export_format import WEIGHTS_FILE, load_draft

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
PROBE = Path(__file__).with_name("sglang_draft_probe.py")
T = 9


def _sglang_step(
    sglang_python: Path, export: Path, tmp_path: Path, inputs: dict, *, with_stderr: bool = False
):
    """The probe's outputs (and, ``with_stderr``, what SGLang logged)."""
    save_file(inputs, str(tmp_path / "inputs.safetensors"))
    env = {**os.environ, "PYTHONPATH": str(Path(eagle3.__file__).parents[1])}
    done = subprocess.run(
        [
            str(sglang_python),
            str(PROBE),
            str(export),
            str(tmp_path / "inputs.safetensors"),
            str(tmp_path / "out.safetensors"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = load_file(str(tmp_path / "out.safetensors"))
    return (out, done.stderr) if with_stderr else out


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "embeds": torch.randn(T, H, generator=g),
        "hidden": 3 * torch.randn(T, 3 * H, generator=g),
        "positions": torch.arange(T),
    }


def _ours(export: Path, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    model, *_ = load_draft(export)
    with torch.no_grad():
        logits, hidden = model(
            inputs["embeds"][None], inputs["hidden"][None], inputs["positions"][None]
        )
    return logits[0], hidden[0]


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"fc_norm": True, "norm_output": True},
        {"fc_norm": True, "norm_output": True, "norm_before_fc": True},
    ],
    ids=["eagle3", "eagle3.1", "eagle3.1+norm_before_fc"],
)
def test_sglang_loads_every_exported_tensor_and_computes_our_step(sglang_python, tmp_path, flags):
    export, _ = _export(tmp_path, **flags)
    inputs = _inputs()
    got = _sglang_step(sglang_python, export, tmp_path, inputs)
    unloaded = [
        k.removeprefix("finite/") for k, v in got.items() if k.startswith("finite/") and not bool(v)
    ]
    assert unloaded == ["model.embed_tokens.weight"]  # the target's, never exported
    exported = load_file(str(export / WEIGHTS_FILE))
    exported_numel = sum(v.numel() for k, v in exported.items() if k not in ("d2t", "t2d"))
    loaded_numel = sum(
        int(v) for k, v in got.items() if k.startswith("numel/") and "embed_tokens" not in k
    )
    # no exported tensor dropped, no SGLang parameter without one
    assert exported_numel == loaded_numel
    assert torch.equal(got["hot_token_id"], exported["d2t"] + torch.arange(exported["d2t"].numel()))
    logits, hidden = _ours(export, inputs)
    torch.testing.assert_close(got["logits"], logits, rtol=1e-4, atol=1e-5)
    # post-norm iff norm_output
    torch.testing.assert_close(got["next_hidden"], hidden, rtol=1e-4, atol=1e-5)


def test_without_the_flags_sglang_drops_the_31_weights_silently_and_computes_another_draft(
    sglang_python, tmp_path
):
    export, _ = _export(tmp_path, fc_norm=True, norm_output=True)
    inputs = _inputs()
    logits, hidden = _ours(export, inputs)
    cfg = json.loads((export / "config.json").read_text())
    for key in ("fc_norm", "norm_output"):
        cfg.pop(key)
    (export / "config.json").write_text(json.dumps(cfg))
    got = _sglang_step(sglang_python, export, tmp_path, inputs)
    assert not any("fc_norm" in k for k in got)  # loaded without an error, the norms dropped
    assert not torch.allclose(got["logits"], logits, atol=1e-3)
    assert not torch.allclose(got["next_hidden"], hidden, atol=1e-3)
