"""The draft vocab type: its maps follow the export format's d2t/t2d rules, and a file breaking them
is refused."""

from __future__ import annotations

import pytest
import torch

from eagle3.model.export_format import vocab_maps
from eagle3.model.vocab import DraftVocab, load_vocab, save_vocab


def test_save_load_roundtrip_and_inconsistent_file_is_rejected(tmp_path):
    d2t, t2d = vocab_maps(torch.tensor([0, 2, 3]), 5)
    vocab = DraftVocab(d2t=d2t, t2d=t2d, counts=torch.tensor([4, 0, 3, 8, 1]))
    # target_id = draft_id + d2t
    assert vocab.target_ids.tolist() == [0, 2, 3] and d2t.tolist() == [0, 1, 1]
    path = save_vocab(vocab, tmp_path / "vocab.safetensors")
    back = load_vocab(tmp_path)
    assert torch.equal(back.d2t, vocab.d2t) and torch.equal(back.t2d, vocab.t2d)
    assert torch.equal(back.counts, vocab.counts)
    broken = DraftVocab(d2t=vocab.d2t, t2d=~vocab.t2d, counts=vocab.counts)
    save_vocab(broken, path)
    with pytest.raises(ValueError, match="t2d and d2t disagree"):
        load_vocab(path)
