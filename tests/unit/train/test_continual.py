"""Nights that build on the champion (``train.init=champion``): the draft starts from the champion's
weights, trains on the rows the champion never saw plus the stated replay share of earlier rows (by
sample id), is reproducible, and a champion that cannot start it is refused before training. Scratch
nights keep their fingerprints. Every comparison is between quantities of the same run (no floats of
the machine-trained world)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3.capture.encoding import column_codecs
from eagle3.capture.schema import FEATURE_SCHEMA, feature_table, footer_metadata
from eagle3.capture.stage import FeatureSource
from eagle3.config.pipeline import with_overrides
from eagle3.data.parquet import ShardWriter
from eagle3.registry import Registry
from eagle3.rundir.layout import CKPT_DIR, METRICS_FILE
from eagle3.rundir.runroot import FileEntry, Manifest
from eagle3.train.checkpoint import latest_checkpoint
from eagle3.train.continual import TRAINED_ON, ChampionError, Start, champion_weights, start_line
from eagle3.train.data import FeatureDataset
from eagle3.train.identity import draft_fingerprint, load_inputs
from eagle3.train.metrics import read_metrics
from eagle3.train.stage import ExportStage, TrainStage, prepare_draft_dir
from eagle3.train.trainer import build_draft
from eagle3.train.workers import train

ROWS_PER_SHARD = 16
# draft_fingerprint(recipe, "features-fp", "vocab-fp") with EAGLE3_HOME=/fixed/home: the
# fingerprints scratch nights had before ``train.init`` existed, which they keep
GOLDEN_SCRATCH = {
    "glm_5": "c8073187ff97fcd3",
    "kimi_k2_5": "be4c68051c40fd19",
    "llama3_8b": "e68fc4fa767e8c5b",
    "tiny": "d2b13643b52663cd",
    "tiny_think": "0611e41e32b86822",
}


def test_scratch_defaults_leave_every_recipe_draft_fingerprint_unchanged(monkeypatch):
    from eagle3.recipes import load_recipe

    monkeypatch.setenv("EAGLE3_HOME", "/fixed/home")
    own = {"kimi_k2_5": ["train.architecture.attention=mha"]}  # the recipe drafts MLA: another
    got = {}
    for name in GOLDEN_SCRATCH:
        got[name] = draft_fingerprint(load_recipe(name, own.get(name)), "features-fp", "vocab-fp")
    assert got == GOLDEN_SCRATCH


def _write_features(draft_world, out: Path) -> list[FileEntry]:
    """The draft world's 64 training rows as four 16-row raw float32 feature shards (sample ids
    ``row-<k>``)."""
    config = draft_world.config
    aux_codec, last_codec = column_codecs("raw", "float32", config.target.hidden_size)
    table = []
    for batch in draft_world.batches:
        for i in range(batch["input_ids"].shape[0]):
            n = int(batch["attention_mask"][i].sum())
            table.append(
                {
                    "sample_id": f"row-{len(table)}",
                    "input_ids": batch["input_ids"][i, :n].tolist(),
                    "loss_mask": batch["loss_mask"][i, :n].long().tolist(),
                    "seq_len": n,
                    "aux_hidden": aux_codec.encode(batch["aux_hidden"][i, :n]),
                    "last_hidden": last_codec.encode(batch["last_hidden"][i, :n]),
                }
            )
    meta = footer_metadata(
        target_model=str(draft_world.model_dir),
        target_revision=None,
        hidden_size=config.target.hidden_size,
        num_layers=config.target.num_layers,
        layer_ids=config.sglang_layer_ids,
        dtype="float32",
        encoding="raw",
        chat_template_hash="-",
        system_prompt_policy="keep",
        truncation="quarantine",
        max_seq_len=1024,
        features_fingerprint=out.name,
    )
    with ShardWriter(out, FEATURE_SCHEMA, metadata=meta, rows_per_shard=ROWS_PER_SHARD) as writer:
        writer.write_table(feature_table(table))
        infos = writer.close()
    return [
        FileEntry.of(i.path, rows=i.rows, base=out, footer_sha256=i.footer_sha256) for i in infos
    ]


def _list_shards(config, features: Path, files: list[FileEntry]) -> None:
    """The features manifest of a night: the shards captured so far."""
    Manifest(
        "features",
        features.name,
        files=files,
        config={"layer_ids": config.sglang_layer_ids, "layer_convention": "input_of_layer"},
    ).write(features)


def _stored(nights) -> FeatureSource:
    return FeatureSource.stored(nights["features"])


def _train_night(config, features: Path, vocab: Path, *, out_dir: Path | None = None):
    """Plan, prepare and train one night in this process (what the stage's worker does), then export
    it."""
    plan = TrainStage().plan(config, features=FeatureSource.stored(features), vocab=vocab)
    if out_dir is not None:
        plan = plan.model_copy(update={"out_dir": out_dir})
    prepare_draft_dir(config, plan)
    train(config, features, plan.vocab, plan.out_dir)
    stored = FeatureSource.stored(features)
    export = ExportStage().plan(config, draft_dir=plan.out_dir, vocab=plan.vocab, features=stored)
    ExportStage().run_unit(config, export, 0)
    return plan, export.export_dir


@pytest.fixture(scope="module")
def nights(draft_world, tmp_path_factory):
    """Night 1 (scratch, shards 0-1) promoted as champion; night 2 lists shards 0-3 and builds on
    it."""
    root = tmp_path_factory.mktemp("continual-root")
    base = with_overrides(draft_world.config, [f"root={root}", "train.epochs=2"])
    features = root / "features" / "fp"
    files = _write_features(draft_world, features)
    _list_shards(base, features, files[:2])
    plan1, export1 = _train_night(base, features, draft_world.vocab_path)
    Registry(root).promote(export1, report="night-1")
    _list_shards(base, features, files)
    config = with_overrides(
        base,
        ["train.init=champion", "train.replay=0.2", "train.save_every=1", "train.keep_last=100"],
    )
    plan2, export2 = _train_night(config, features, draft_world.vocab_path)
    return {
        "root": root,
        "base": base,
        "config": config,
        "features": features,
        "files": files,
        "plan1": plan1,
        "plan2": plan2,
        "export1": export1,
        "export2": export2,
    }


def test_champion_night_starts_from_the_champion_weights_within_one_adam_step(nights, draft_world):
    plan2, export1 = nights["plan2"], nights["export1"]
    start = Start.read(plan2.out_dir)
    assert start.champion and start.champion_id == Registry(nights["root"]).champion().draft_id
    champion = {
        k: v.float()
        for k, v in load_file(str(export1 / "model.safetensors")).items()
        if k not in ("d2t", "t2d")
    }
    # step 0: the champion's tensors, all of them
    assert champion_weights(start).keys() == champion.keys()
    assert all(torch.equal(champion_weights(start)[k], champion[k]) for k in champion)
    step1 = load_file(str(plan2.out_dir / CKPT_DIR / "step-000001" / "model.safetensors"))
    peak = nights["config"].train.lr * nights["config"].train.champion_lr_scale
    # Adam's first update moves each weight by at most its lr (|m / sqrt(v)| = 1): step 1 is the
    # champion + 1 step
    assert max((step1[k] - champion[k]).abs().max().item() for k in champion) <= peak * 1.01
    # ... where a fresh draft (the scratch start, same seed) is far from the champion: the bound
    # above is not loose
    fresh = build_draft(
        load_inputs(nights["config"], plan2.vocab), nights["config"].train.seed
    ).state_dict()
    assert max((fresh[k] - champion[k]).abs().max().item() for k in champion) > 10 * peak
    vocab1, vocab2 = (
        load_file(str(export1 / "model.safetensors")),
        load_file(str(nights["export2"] / "model.safetensors")),
    )
    assert torch.equal(vocab1["d2t"], vocab2["d2t"]) and torch.equal(vocab1["t2d"], vocab2["t2d"])


def test_champion_night_trains_on_new_rows_plus_the_stated_replay_share_by_sample_id(nights):
    start = Start.read(nights["plan2"].out_dir)
    new_ids = {f"row-{k}" for k in range(2 * ROWS_PER_SHARD, 4 * ROWS_PER_SHARD)}
    old_ids = {f"row-{k}" for k in range(2 * ROWS_PER_SHARD)}
    replay = nights["config"].train.replay
    assert start.new_rows == len(new_ids) and start.old_rows == len(old_ids)
    assert len(start.replay_ids) == round(len(new_ids) * replay / (1 - replay)) == 8
    assert set(start.replay_ids) <= old_ids
    loader = FeatureDataset(nights["features"], rows=start.rows, shuffle=True, seed=3, batch_size=1)
    seen = []
    for _ in loader:
        seen += [part.split("samples ")[1].strip("[]'") for part in loader.origin().split("; ")]
    # each row once per epoch, no other row
    assert sorted(seen) == sorted(new_ids | set(start.replay_ids))
    assert nights["plan2"].train_samples == len(seen)
    # the trainer took those rows: its step count is theirs, not all 64 rows'
    train_cfg = nights["config"].train
    last = read_metrics(nights["plan2"].out_dir / METRICS_FILE)[-1]
    assert (
        last["total_steps"]
        == train_cfg.epochs * math.ceil(len(seen) / train_cfg.batch_size)
        < train_cfg.epochs * 16
    )


def test_champion_night_is_reproducible_and_its_fingerprint_names_the_champion(nights, tmp_path):
    config, features, vocab = nights["config"], nights["features"], nights["plan2"].vocab
    again, _ = _train_night(
        config, features, Path(nights["plan1"].vocab), out_dir=tmp_path / "again"
    )
    assert again.fingerprint == nights["plan2"].fingerprint != nights["plan1"].fingerprint
    assert Start.read(again.out_dir) == Start.read(nights["plan2"].out_dir)
    first = load_file(
        str(latest_checkpoint(nights["plan2"].out_dir / CKPT_DIR) / "model.safetensors")
    )
    second = load_file(str(latest_checkpoint(again.out_dir / CKPT_DIR) / "model.safetensors"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    other = Start(**{**Start.read(again.out_dir).__dict__, "champion_id": "another"})
    assert (
        draft_fingerprint(config, features.name, vocab.parent.name, other.identity())
        != again.fingerprint
    )
    assert json.loads((nights["export2"] / TRAINED_ON).read_text())["shards"].keys() == {
        Path(f.path).name for f in nights["files"]
    }


def _refused(config, nights, match: str) -> None:
    with pytest.raises(ChampionError, match=match):
        TrainStage().plan(config, features=_stored(nights), vocab=nights["plan1"].vocab)


def test_unloadable_champion_is_refused_before_training_naming_the_fix(nights, tmp_path):
    config, root = nights["config"], nights["root"]
    other = with_overrides(config, [f"root={tmp_path}"])
    registry = Registry(tmp_path)
    registry.dir.mkdir(parents=True)
    missing = {
        **json.loads(Registry(root).pointer.read_text()),
        "draft_dir": str(tmp_path / "gone"),
    }
    registry.pointer.write_text(json.dumps(missing))
    _refused(other, nights, "is gone: restore it .*train.init=scratch")
    bigger = with_overrides(config, ["train.draft_intermediate_size=96"])
    _refused(bigger, nights, "another draft architecture.*train.init=scratch")
    undocumented = shutil.copytree(nights["export1"], tmp_path / "undocumented")
    (undocumented / TRAINED_ON).unlink()
    registry.pointer.unlink()
    # same weights, no record of its data (nor its draft dir's)
    registry.promote(undocumented, report="x")
    shutil.move(nights["plan1"].out_dir / TRAINED_ON, tmp_path / "kept")
    try:
        _refused(other, nights, "has no trained_on.json.*train.init=scratch")
    finally:
        shutil.move(tmp_path / "kept", nights["plan1"].out_dir / TRAINED_ON)
    assert not (tmp_path / "drafts").exists()  # nothing was trained under the refusing root


def test_champion_night_without_new_rows_is_refused_and_a_new_vocab_size_trains_from_scratch(
    nights, tmp_path
):
    root = tmp_path / "root"
    shutil.copytree(nights["root"] / "registry", root / "registry")
    config = with_overrides(nights["config"], [f"root={root}"])
    # the night-2 draft has seen all four shards
    Registry(root).promote(nights["export2"], report="night-2")
    # ... and it is not this root's own night (its draft dir is under another root): nothing new,
    # refused
    _refused(config, nights, "has trained on every row.*--scale.*train.init=scratch")
    resized = with_overrides(config, ["vocab.draft_vocab_size=256"])
    plan = TrainStage().plan(resized, features=_stored(nights), vocab=nights["plan1"].vocab)
    assert plan.start["mode"] == "scratch" and "new vocab mapping" in plan.start["note"]
    assert plan.fingerprint == draft_fingerprint(
        resized, nights["features"].name, nights["plan1"].vocab.parent.name
    )


def test_rerun_of_a_night_whose_own_draft_was_promoted_reuses_that_draft(nights):
    """A night killed after its gate promoted its draft (or re-triggered) plans again: the champion
    has seen every row because it is tonight's own draft, so the plan finds that draft done instead
    of refusing 'nothing new'."""
    registry = Registry(nights["root"])
    pointer = registry.pointer.read_text()
    registry.promote(nights["export2"], report="night-2")
    try:
        plan = TrainStage().plan(
            nights["config"], features=_stored(nights), vocab=nights["plan1"].vocab
        )
        report = TrainStage().run_unit(nights["config"], plan, 0)
    finally:
        registry.pointer.write_text(pointer)
    assert (plan.fingerprint, plan.out_dir) == (
        nights["plan2"].fingerprint,
        nights["plan2"].out_dir,
    )
    # its own start, no worker started
    assert plan.start == nights["plan2"].start and report.skipped
    # night 1 is the champion again
    assert json.loads(pointer)["draft_id"] == registry.champion().draft_id


def test_night_plan_and_summary_lines_show_init_champion_and_replay_share(nights):
    from eagle3.train.continual import planned_start_line, start_line

    champion_id = Registry(nights["root"]).champion().draft_id
    assert champion_id in planned_start_line(
        nights["config"]
    ) and "replay share 0.2" in planned_start_line(nights["config"])
    assert "train.init=scratch" in planned_start_line(nights["base"])
    line = start_line(Start(**nights["plan2"].start).summary())
    assert champion_id in line and "32 new rows + 8 replayed (replay share 0.2)" in line
    assert start_line(Start(note="no draft has been promoted yet").summary()).startswith(
        "- training: from scratch"
    )


EAGLE31 = ["train.architecture.fc_norm=true", "train.architecture.norm_output=true"]


def test_eagle3_champion_starts_an_eagle31_night_with_its_weights_and_the_new_norms_at_ones(nights):
    config = with_overrides(nights["config"], EAGLE31)
    plan = TrainStage().plan(config, features=_stored(nights), vocab=nights["plan1"].vocab)
    start = Start(**plan.start)
    assert start.champion and "EAGLE-3 champion starting an EAGLE 3.1 draft" in start.note
    assert "3 new norm tensors start at ones" in start_line(start.summary())
    champion = champion_weights(start)
    draft = build_draft(
        load_inputs(config, nights["plan1"].vocab), config.train.seed, champion
    ).state_dict()
    added = sorted(draft.keys() - champion.keys())
    assert added == ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"]
    assert all(torch.equal(draft[k], torch.ones_like(draft[k])) for k in added)
    assert all(torch.equal(draft[k], champion[k]) for k in champion)


def test_eagle31_champion_is_refused_for_an_eagle3_night_whose_draft_would_drop_its_norms(
    nights, tmp_path
):
    export = shutil.copytree(nights["export1"], tmp_path / "eagle31")
    tensors = load_file(str(export / "model.safetensors"))
    width = tensors["fc.weight"].shape[1] // 3
    save_file(
        {**tensors, **{f"fc_norm.{i}.weight": torch.ones(width) for i in range(3)}},
        str(export / "model.safetensors"),
    )
    cfg = json.loads((export / "config.json").read_text())
    (export / "config.json").write_text(json.dumps({**cfg, "fc_norm": True}))
    root = tmp_path / "root"
    Registry(root).dir.mkdir(parents=True)
    Registry(root).promote(export, report="a 3.1 champion")
    _refused(
        with_overrides(nights["config"], [f"root={root}"]),
        nights,
        "another draft architecture.*fc_norm",
    )
