"""The vocab stage: select which target ids the draft's ``lm_head`` can emit.

* Counts are taken over loss-masked positions only (the tokens the draft is trained to predict),
  over the samples the draft trains on: the feature shards, or, for online training, the samples the
  online plan takes from the regen shards (the admitted rows capture would write), so one night
  selects one vocab either way.
* The draft vocab is the top ``draft_vocab_size`` ids by count, ties broken by the lower id, then
  sorted ascending. When fewer distinct ids were seen, it is padded with the lowest unseen ids, so
  the size is always the configured one (the draft's ``lm_head`` shape is fixed by config); it can
  never exceed the target vocab.
* The maps of the selected ids follow the export format (``eagle3.model.export_format.vocab_maps``)
  and are saved with the ``counts`` they came from (``eagle3.model.vocab``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from eagle3.capture.manifest import feature_shards
from eagle3.capture.stage import FeatureSource
from eagle3.config.pipeline import PipelineConfig
from eagle3.data.parquet import open_shard
from eagle3.model.export_format import vocab_maps
from eagle3.model.vocab import DraftVocab, save_vocab
from eagle3.rundir.integrity import checked_read
from eagle3.rundir.layout import VOCAB_FILE, stage_dir
from eagle3.rundir.runroot import FileEntry, Manifest, fingerprint
from eagle3.stage import OnProgress, Plan, Stage, StageResult, Unit, UnitReport

logger = logging.getLogger(__name__)

_COUNT_SCHEMA = pa.schema(
    [("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8()))]
)


def count_tokens(shard_paths: Iterable[Path], *, vocab_size: int | None = None) -> torch.Tensor:
    """Occurrences of each target id at loss-masked positions over the shards (footer and schema
    validated).

    ``vocab_size`` fixes the length (an id beyond it is an error); None sizes it to the largest id
    seen + 1."""
    counts = np.zeros(vocab_size or 0, dtype=np.int64)
    for path in shard_paths:
        for batch in _batches(path):
            ids = pc.list_flatten(batch.column("input_ids")).to_numpy()
            mask = pc.list_flatten(batch.column("loss_mask")).to_numpy().astype(bool)
            if ids.shape != mask.shape:
                raise ValueError(
                    f"{path}: input_ids and loss_mask lengths differ; rebuild the shard"
                )
            ids = ids[mask]
            if ids.size and ids.min() < 0:
                raise ValueError(f"{path}: negative token id {ids.min()}")
            if vocab_size is not None and ids.size and ids.max() >= vocab_size:
                raise ValueError(
                    f"{path}: token id {ids.max()} >= target.vocab_size={vocab_size}; fix the config"
                )
            found = np.bincount(ids, minlength=len(counts))
            if len(found) > len(counts):
                counts = np.pad(counts, (0, len(found) - len(counts)))
            counts += found
    return torch.from_numpy(counts)


def _batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The token columns of a feature shard, each page checked against its checksum as it is read:
    these columns are a sliver of a shard's bytes, so the shards are not hashed whole first
    (``eagle3.rundir.integrity``)."""
    with checked_read(path, rebuild="eagle3 capture"):
        yield from open_shard(path, schema=_COUNT_SCHEMA).iter_batches(columns=_COUNT_SCHEMA.names)


def build_vocab(counts: torch.Tensor, draft_vocab_size: int) -> DraftVocab:
    """Top ``draft_vocab_size`` ids by count (ties: lower id), padded with the lowest unseen ids,
    ascending."""
    counts = counts.to(torch.int64)
    target_vocab = int(counts.numel())
    if draft_vocab_size > target_vocab:
        raise ValueError(
            f"vocab.draft_vocab_size={draft_vocab_size} exceeds the target vocab ({target_vocab}); "
            f"set vocab.draft_vocab_size <= {target_vocab}"
        )
    # sort by count descending, then id ascending: a stable sort by -count over ids already in
    # ascending order
    order = torch.sort(-counts, stable=True).indices
    # unseen ids (count 0) come last, lowest first: the padding rule
    chosen = order[:draft_vocab_size]
    d2t, t2d = vocab_maps(torch.sort(chosen).values, target_vocab)
    seen = int((counts > 0).sum())
    if seen < draft_vocab_size:
        logger.warning(
            "only %d distinct ids seen; padded the draft vocab with %d unseen ids",
            seen,
            draft_vocab_size - seen,
        )
    return DraftVocab(d2t=d2t, t2d=t2d, counts=counts)


def coverage(counts: torch.Tensor, vocab: DraftVocab) -> float:
    """Share of loss-masked tokens (by ``counts``) whose id is inside the draft vocab."""
    total = int(counts.sum())
    return float(counts[vocab.t2d].sum()) / total if total else 0.0


def top_tokens(counts: torch.Tensor, k: int = 20) -> list[tuple[int, int]]:
    """The ``k`` most frequent ids as ``(id, count)`` (ties: lower id)."""
    order = torch.sort(-counts, stable=True).indices[:k]
    return [(int(i), int(counts[i])) for i in order if counts[i] > 0]


def vocab_fingerprint(config: PipelineConfig, features_fp: str) -> str:
    return fingerprint(
        "vocab", features_fp, config.vocab.draft_vocab_size, config.target.vocab_size
    )


def loss_token_counts(config: PipelineConfig, features: FeatureSource) -> torch.Tensor:
    """Occurrences of each target id at loss-masked positions of the samples trained on (module
    docstring)."""
    if not features.online:
        shards = feature_shards(features.features_dir)
        return count_tokens(shards, vocab_size=config.target.vocab_size)
    from eagle3.train.online.plan import OnlinePlan

    assert features.regen_dir is not None
    plan = OnlinePlan.for_night(config, features.regen_dir, world_size=1)
    counts = np.zeros(config.target.vocab_size, dtype=np.int64)
    for sample in (s for group in plan.groups for s in group):
        ids = np.asarray(sample.input_ids, dtype=np.int64)[np.asarray(sample.loss_mask, dtype=bool)]
        counts += np.bincount(ids, minlength=len(counts))
    return torch.from_numpy(counts)


def build_vocab_stage(config: PipelineConfig, features: FeatureSource) -> Path:
    """Count, select and save the draft vocab of the samples trained on; returns the vocab file
    ``<root>/vocab/<fp>/vocab.safetensors`` (what the trainer and export load).

    Skipped when that directory's manifest exists and its files verify."""
    # Keyed on the samples, not the directory: nightly runs add shards to one features directory.
    fp = vocab_fingerprint(config, features.samples_fingerprint())
    out_dir = stage_dir(config.root_path, "vocab", fp)
    done = Manifest.read(out_dir)
    if done is not None and not done.verify(out_dir):
        logger.info("draft vocab %s already built; skipping", out_dir)
        return out_dir / VOCAB_FILE
    counts = loss_token_counts(config, features)
    vocab = build_vocab(counts, config.vocab.draft_vocab_size)
    path = save_vocab(vocab, out_dir / VOCAB_FILE)
    stats = {
        "coverage": round(coverage(counts, vocab), 6),
        "distinct_ids": int((counts > 0).sum()),
        "loss_tokens": int(counts.sum()),
        "draft_vocab_size": vocab.draft_vocab_size,
        "top_tokens": top_tokens(counts, 20),
    }
    where = features.regen_dir if features.online else features.features_dir
    origin = {"regen" if features.online else "features": str(where)}
    entry = FileEntry.of(path, rows=vocab.draft_vocab_size, base=out_dir)
    config_record = {"vocab": config.vocab.model_dump(), **origin}
    manifest = Manifest(
        stage="vocab", fingerprint=fp, files=[entry], config=config_record, stats=stats
    )
    manifest.write(out_dir)
    logger.info(
        "draft vocab: %d ids, coverage %.4f of loss tokens",
        vocab.draft_vocab_size,
        stats["coverage"],
    )
    return path


class VocabPlan(Plan):
    features: FeatureSource


class VocabStage(Stage[VocabPlan]):
    """The vocab stage as one unit (``eagle3.stage``): the draft vocab of the samples the draft
    trains on."""

    name = "vocab"
    inputs: ClassVar[dict[str, str]] = {"features": "features"}

    def plan(self, config: PipelineConfig, *, features: FeatureSource) -> VocabPlan:
        fp = vocab_fingerprint(config, features.samples_fingerprint())
        out_dir = stage_dir(config.root_path, "vocab", fp)
        return VocabPlan(stage=self.name, fingerprint=fp, out_dir=out_dir, features=features)

    def run_unit(
        self,
        config: PipelineConfig,
        plan: VocabPlan,
        unit: Unit,
        *,
        env: Any = None,
        on_progress: OnProgress | None = None,
    ) -> UnitReport:
        skipped = Manifest.read(plan.out_dir) is not None
        path = build_vocab_stage(config, plan.features)
        return UnitReport(
            unit=unit,
            skipped=skipped,
            rows=config.vocab.draft_vocab_size,
            detail={"path": str(path)},
        )

    def unit_output(self, plan: VocabPlan, unit: Unit) -> Path:
        return plan.out_dir / VOCAB_FILE

    def finalize(
        self,
        config: PipelineConfig,
        plan: VocabPlan,
        reports: Sequence[UnitReport],
        failed: Sequence[Unit],
    ) -> StageResult:
        if failed:
            return self.failed_result(plan, failed)
        manifest = Manifest.read(plan.out_dir)
        stats = manifest.stats if manifest is not None else {}
        return StageResult(
            stage=self.name,
            fingerprint=plan.fingerprint,
            out_dir=plan.out_dir,
            done=True,
            summary={"vocab": str(plan.out_dir / VOCAB_FILE), **stats},
        )
