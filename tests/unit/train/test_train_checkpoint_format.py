"""Checkpoints without pickle: optimizer state through safetensors + JSON, RNG states through JSON,
atomic ``latest`` pointer, pruning to ``keep_last``, and a clear error for a pointer to an
incomplete checkpoint."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from eagle3.train.checkpoint import (
    flatten_tensors,
    latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    unflatten_tensors,
)


def _optimizer_state() -> dict:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return opt.state_dict()


def test_optimizer_state_round_trips_through_flat_tensors_and_json():
    state = _optimizer_state()
    structure, tensors = flatten_tensors(state)
    restored = unflatten_tensors(structure, tensors)
    assert restored["param_groups"][0]["betas"] == state["param_groups"][0]["betas"]
    assert isinstance(restored["param_groups"][0]["betas"], tuple)
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(restored["state"]["0"][key], state["state"][0][key])


def test_rng_states_restore_python_numpy_and_torch_streams():
    saved = rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(saved)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_latest_pointer_names_the_newest_and_old_checkpoints_are_pruned(tmp_path):
    for step in (1, 2, 3, 4):
        save_checkpoint(
            tmp_path,
            step,
            model={"w": torch.full((2,), float(step))},
            optimizer=_optimizer_state(),
            trainer={"note": step},
            rank_state={"loader": {"index": step}},
            keep_last=2,
        )
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000003", "step-000004"]
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step-000004"
    ckpt = load_checkpoint(latest)
    assert ckpt.step == 4 and torch.equal(ckpt.model["w"], torch.full((2,), 4.0))
    assert ckpt.rank_state == {"loader": {"index": 4}} and ckpt.trainer["note"] == 4
    assert not list(tmp_path.glob(".tmp-*"))


def test_no_pointer_means_a_fresh_run_and_a_dangling_pointer_is_an_error(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    (tmp_path / "latest").write_text("step-000009\n")
    with pytest.raises(FileNotFoundError, match="incomplete"):
        latest_checkpoint(tmp_path)
