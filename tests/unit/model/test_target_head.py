"""The draft's frozen target tensors are read as the target has them, or refused: never a quantized
head read as float, never an embedding standing in for a head the checkpoint says is separate."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from eagle3.model.target_weights import load_target_head


def _checkpoint(path, tensors: dict[str, torch.Tensor]) -> str:
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"))
    return str(path)


@pytest.mark.parametrize(
    "stored",
    [
        {
            "lm_head.weight_packed": torch.zeros(64, 4, dtype=torch.int32),
            "lm_head.weight_scale": torch.ones(64, 1),
        },
        {
            "lm_head.weight": torch.zeros(64, 32, dtype=torch.float8_e4m3fn),
            "lm_head.weight_scale_inv": torch.ones(1, 1),
        },
    ],
    ids=["int4-pack-quantized", "block-fp8"],
)
def test_a_quantized_head_is_refused_naming_its_tensors(tmp_path, stored):
    path = _checkpoint(
        tmp_path / "ckpt", {"model.embed_tokens.weight": torch.randn(64, 32), **stored}
    )
    with pytest.raises(
        ValueError, match=r"stores the target's embedding or lm_head quantized \(lm_head\.weight_"
    ):
        load_target_head(path, tie_word_embeddings=False)


def test_a_missing_head_is_refused_when_the_config_says_it_is_not_tied(tmp_path):
    path = _checkpoint(tmp_path / "ckpt", {"model.embed_tokens.weight": torch.randn(64, 32)})
    with pytest.raises(
        KeyError, match="tie_word_embeddings=false, so the embedding is not its head"
    ):
        load_target_head(path, tie_word_embeddings=False)
    assert load_target_head(path, tie_word_embeddings=True).tied
