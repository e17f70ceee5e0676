"""The tiny target and its cached world: tokenizer, chat template, model files, training and the
build cache.

A small world is built once for this module; the default world (slow) is built once for the
non-degeneracy check. Set EAGLE3_TINY_WORLD_CACHE to a directory to reuse worlds across test runs.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from eagle3.worlds import world as world_module
from eagle3.worlds.conversations import generate_conversations
from eagle3.worlds.tiny_target import BOS, IM_END, build_model, build_tokenizer, train_model
from eagle3.worlds.world import TinyWorld, TinyWorldSpec, build_tiny_world, world_dir_for

SMALL = TinyWorldSpec(
    rows_per_source=40,
    num_layers=4,
    train_conversations=800,
    train_steps=20,
    train_batch_size=4,
    train_seq_len=128,
    pretokenized_rows=12,
)
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hi! How can I sleep better at night?"},
    {"role": "assistant", "content": "Keep your bedroom cool, dark and quiet."},
    {"role": "user", "content": "What should I avoid?"},
    {"role": "assistant", "content": "Skip coffee after lunch. ☕"},
]


@pytest.fixture(scope="module", autouse=True)
def _offline() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(os.environ.get("EAGLE3_TINY_WORLD_CACHE") or tmp_path_factory.mktemp("world-cache"))


@pytest.fixture(scope="module")
def small_world(cache_dir: Path) -> TinyWorld:
    return build_tiny_world(cache_dir, SMALL)[0]


@pytest.fixture(scope="module")
def tokenizer(small_world: TinyWorld) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(small_world.model_dir)


def test_second_build_is_a_cache_hit(cache_dir: Path, small_world: TinyWorld) -> None:
    messages: list[str] = []
    again, hit = build_tiny_world(cache_dir, SMALL, progress=messages.append)
    assert hit and again == small_world
    assert small_world.root == world_dir_for(cache_dir, SMALL)
    assert len(messages) == 1 and "cache hit" in messages[0]


def test_build_leaves_only_the_finished_world(cache_dir: Path, small_world: TinyWorld) -> None:
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".")]
    assert (small_world.root / "world.json").is_file()
    assert all(path.exists() for path in [*small_world.samples.values(), small_world.pretokenized])


def test_failed_build_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(root: Path, spec: TinyWorldSpec, say: object, threads: int) -> TinyWorld:
        (root / "data").mkdir(parents=True)
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(world_module, "_build_into", explode)
    with pytest.raises(RuntimeError, match="killed mid-build"):
        build_tiny_world(tmp_path, SMALL)
    assert list(tmp_path.iterdir()) == []


def test_fingerprint_changes_with_any_field() -> None:
    assert (
        SMALL.fingerprint() == TinyWorldSpec(**json.loads(json.dumps(SMALL.__dict__))).fingerprint()
    )
    assert (
        len(
            {
                SMALL.fingerprint(),
                TinyWorldSpec().fingerprint(),
                TinyWorldSpec(seed=1).fingerprint(),
            }
        )
        == 3
    )


def test_a_model_seed_from_the_environment_trains_another_target_on_the_same_data(
    cache_dir: Path, small_world: TinyWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    other_seed = (SMALL.seed if SMALL.model_seed is None else SMALL.model_seed) + 7
    monkeypatch.setenv(world_module.MODEL_SEED_ENV, str(other_seed))
    spec = TinyWorldSpec(**{k: v for k, v in SMALL.__dict__.items() if k != "model_seed"})
    assert spec.model_seed == other_seed and spec.fingerprint() != SMALL.fingerprint()
    other, hit = build_tiny_world(cache_dir, spec)
    assert not hit and other.root != small_world.root
    # every sample file, byte for byte
    assert other.manifest.read_text() == small_world.manifest.read_text()
    assert (other.model_dir / "tokenizer.json").read_bytes() == (
        small_world.model_dir / "tokenizer.json"
    ).read_bytes()
    weights = [(w.model_dir / "model.safetensors").read_bytes() for w in (small_world, other)]
    assert weights[0] != weights[1]


def test_model_and_tokenizer_load_offline_with_auto_classes(
    small_world: TinyWorld, tokenizer: PreTrainedTokenizerBase
) -> None:
    model = AutoModelForCausalLM.from_pretrained(small_world.model_dir)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    assert model.config.tie_word_embeddings is False
    assert model.config.eos_token_id == tokenizer.eos_token_id == im_end
    assert im_end in model.generation_config.eos_token_id
    # padded like real targets
    assert model.config.vocab_size == SMALL.vocab_size == small_world.report["vocab_size"]
    assert len(tokenizer) <= model.config.vocab_size
    assert model.config.num_hidden_layers == SMALL.num_layers


def test_tokenizer_round_trips_unicode(tokenizer: PreTrainedTokenizerBase) -> None:
    texts = [
        "héllo wörld",
        "日本語のテキスト",
        "emoji 🎉🚀 mix",
        "tabs\tand\n\nnewlines  ",
        "def f(x):\n    return x",
    ]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text


def test_encoding_rendered_text_keeps_a_single_bos(tokenizer: PreTrainedTokenizerBase) -> None:
    rendered = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    ids = tokenizer.apply_chat_template(CONVERSATION, return_dict=True)["input_ids"]
    assert rendered.startswith(BOS) and rendered.count(BOS) == 1
    assert tokenizer(rendered)["input_ids"] == ids


def test_template_has_the_prefix_property(tokenizer: PreTrainedTokenizerBase) -> None:
    def render(messages: list[dict[str, str]], *, prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)

    for i in range(1, len(CONVERSATION)):
        longer = render(CONVERSATION[: i + 1], prompt=False)
        assert longer.startswith(render(CONVERSATION[:i], prompt=False))
        if CONVERSATION[i]["role"] == "assistant":
            prefix = render(CONVERSATION[:i], prompt=True)
            assert longer.startswith(prefix)
            assert (
                tokenizer(longer)["input_ids"][: len(tokenizer(prefix)["input_ids"])]
                == tokenizer(prefix)["input_ids"]
            )


def test_template_marks_assistant_spans(tokenizer: PreTrainedTokenizerBase) -> None:
    enc = tokenizer.apply_chat_template(
        CONVERSATION, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = enc["input_ids"], enc["assistant_masks"]
    marked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    expected = "".join(m["content"] + IM_END for m in CONVERSATION if m["role"] == "assistant")
    assert marked == expected


def test_pretokenized_rows_match_bad_row_ground_truth(
    small_world: TinyWorld, tokenizer: PreTrainedTokenizerBase
) -> None:
    rows = pq.read_table(small_world.pretokenized).to_pylist()
    vocab = small_world.report["vocab_size"]
    broken = {
        i
        for i, row in enumerate(rows)
        if len(row["input_ids"]) != len(row["loss_mask"]) or max(row["input_ids"]) >= vocab
    }
    recorded = small_world.load_bad_rows()["pretokenized"]
    assert broken == {r["row"] for r in recorded} and {r["reason"] for r in recorded} == {
        "malformed"
    }
    assert len(rows) == SMALL.pretokenized_rows + 2
    for i, row in enumerate(rows):
        if i not in broken:
            assert row["input_ids"][0] == tokenizer.bos_token_id and 0 < sum(
                row["loss_mask"]
            ) < len(row["loss_mask"])
            masked = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
            assert tokenizer.decode(masked).endswith(IM_END)


def test_world_report_records_training(small_world: TinyWorld) -> None:
    report = small_world.report
    assert report["train_loss_last"] < report["train_loss_first"]
    assert report["params"] > 0 and report["model_bytes"] > 4 * report["params"]
    assert report["fingerprint"] == SMALL.fingerprint()


def test_training_is_deterministic_for_a_seed() -> None:
    conversations = generate_conversations(200, seed=9)
    tokenizer = build_tokenizer((m["content"] for c in conversations for m in c), vocab_size=400)

    def run() -> tuple[list[float], torch.Tensor]:
        model = build_model(tokenizer, num_layers=2, hidden_size=32, intermediate_size=64, seed=4)
        losses = train_model(
            model, tokenizer, conversations, steps=4, batch_size=2, seq_len=64, seed=4
        )
        return losses, model.lm_head.weight.detach().clone()

    deterministic_before = torch.are_deterministic_algorithms_enabled()
    (first, w1), (second, w2) = run(), run()
    assert first == second and torch.equal(w1, w2)
    # global setting restored
    assert torch.are_deterministic_algorithms_enabled() == deterministic_before


@pytest.mark.slow
def test_default_world_target_is_not_degenerate(cache_dir: Path) -> None:
    world, _ = build_tiny_world(cache_dir)
    assert world.report["train_loss_last"] < 3.0 < world.report["train_loss_first"]
    tokenizer = AutoTokenizer.from_pretrained(world.model_dir)
    model = AutoModelForCausalLM.from_pretrained(world.model_dir).eval()
    prompts = [
        "Write a Python function `get_scale_7(xs)` that multiplies every number in a list by 7.",
        "Hello! How can I save a bit of money each month?",
    ]
    for prompt in prompts:
        enc = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        outputs = [
            model.generate(**enc, max_new_tokens=64, do_sample=False)[0].tolist() for _ in range(2)
        ]
        assert outputs[0] == outputs[1]
        new = outputs[0][enc["input_ids"].shape[1] :]
        assert len(set(new)) >= 8, tokenizer.decode(new)
        assert Counter(new).most_common(1)[0][1] <= len(new) // 3, tokenizer.decode(new)
