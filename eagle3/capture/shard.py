"""Capture one regen shard into one feature shard (same index), resumable per shard and per batch.

Layout inside ``<root>/features/<fp>/``::

    shard-NNNNN.parquet           finished features (FEATURE_SCHEMA), written last for its shard
    quarantine-NNNNN.parquet      rows not captured, with a reason (too_long, non_finite, bad_input)
    hashes-NNNNN.json             both files' sizes and sha256s, from their writer (written after the shard)
    parts-NNNNN/                  while running: one part file per forward batch, deleted with the finished shard
    manifest.json                 written by ``eagle3.capture.manifest`` once every shard is done

Resume rules (docs/DESIGN.md, "Reliability rules"). A finished shard is skipped only if it opens
(footer), has the schema, carries this stage's fingerprint, and its rows plus its quarantined rows
equal the regen shard's rows; otherwise it is rebuilt. Inside a shard each forward batch is written
as an atomic part file, so a ``kill -9`` loses at most the batches in flight (the one forwarding and
up to ``WRITE_AHEAD`` waiting for the writer); a part that does not validate is deleted and redone.
Writer threads (``PartWriter``) write the parts and stream them, in order, into the final shard
through the shared ``ShardWriter`` (byte-sized row groups), so compression overlaps the forward; the
shard is renamed into place only once every batch is written. Batches are planned by sorting samples
by length (longest first, so an out-of-memory shows up on the first batch) and cutting when the
padded token count would pass ``capture.batch_tokens``; the plan is a pure function of the input, so
resumed runs write the same rows in the same order as uninterrupted ones.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from eagle3.capture.backends import CaptureBackend, TopK, check_shapes, make_backend, stored_final
from eagle3.capture.encoding import ColumnCodec, FinalCodec, column_codecs, encoding_topk
from eagle3.capture.schema import (
    CAPTURE_QUARANTINE_SCHEMA,
    FEATURE_SCHEMA,
    LAYER_CONVENTION,
    REASON_BAD_INPUT,
    REASON_TOO_LONG,
    footer_metadata,
)
from eagle3.capture.writer import Batch, PartWriter, record_hashes
from eagle3.config.pipeline import PipelineConfig
from eagle3.data.parquet import ShardError, ShardInfo, open_shard, shard_metadata
from eagle3.data.template import template_hash
from eagle3.rundir.integrity import verify_files
from eagle3.rundir.layout import (
    SHARD_GLOB,
    hashes_file_name,
    parts_dir_name,
    shard_index,
    shard_name,
)
from eagle3.rundir.runroot import (
    fingerprint,
    footer_sha256,
    remove_in_background,
    sha256_file,
)
from eagle3.runtime.stop import raise_if_stopped
from eagle3.runtime.transfer import HostCopy
from eagle3.target_io import load_tokenizer

logger = logging.getLogger(__name__)

REGEN_INPUT_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.uint8())),
    ]
)
# (samples done, samples total, tokens done), once on disk
ProgressFn = Callable[[int, int, int], None]
_PART_RE = re.compile(r"(shard|quarantine)-\d{5}\.part-(\d{5})\.parquet$")


@dataclass
class Sample:
    sample_id: str
    input_ids: list[int]
    loss_mask: list[int]


def features_fingerprint(config: PipelineConfig, regen_fp: str) -> str:
    """Fingerprint of the features stage: regen data, target, layers (+convention), dtype, encoding
    (and its k for ``fp8_topk``, appended only there so the other encodings keep their
    fingerprints), length policy, and the backend when it is not ``hf`` (with SGLang's
    ``--quantization`` when one is forced): states from another engine or another quantization of
    the target are another stage, appended so ``hf`` fingerprints stay as they were. (Not the
    Parquet codecs: they change bytes on disk, not the states a reader gets back; nor tensor
    parallelism: the same target split another way.)"""
    capture = config.capture
    topk = encoding_topk(capture.encoding, capture.topk)
    engine = [] if capture.backend == "hf" else [capture.backend, capture.sglang.quantization]
    return fingerprint(
        "features",
        regen_fp,
        config.target.model_path,
        config.target.revision,
        config.sglang_layer_ids,
        LAYER_CONVENTION,
        capture.dtype,
        capture.encoding,
        capture.max_seq_len,
        capture.truncation,
        *([] if topk is None else [topk]),
        *engine,
    )


def shard_index_of(path: Path) -> int:
    index = shard_index(path)
    if index is None:
        raise ValueError(f"{path}: not a shard file (expected shard-NNNNN.parquet)")
    return index


def regen_shards(regen_dir: Path) -> list[Path]:
    """The ready regen shards of a regen stage directory, in shard order (what capture would
    capture)."""
    return sorted(Path(regen_dir).glob(SHARD_GLOB), key=shard_index_of)


def output_paths(out_dir: Path, index: int) -> tuple[Path, Path, Path]:
    """(feature shard, quarantine file, parts directory) of shard ``index``."""
    out_dir = Path(out_dir)
    return (
        out_dir / shard_name(index),
        out_dir / shard_name(index, "quarantine"),
        out_dir / parts_dir_name(index),
    )


def shard_footer(config: PipelineConfig, fp: str) -> dict[str, str]:
    target = config.target
    return footer_metadata(
        target_model=target.model_path,
        target_revision=target.revision,
        hidden_size=target.hidden_size,
        num_layers=target.num_layers,
        layer_ids=config.sglang_layer_ids,
        dtype=config.capture.dtype,
        encoding=config.capture.encoding,
        chat_template_hash=template_hash(load_tokenizer(target)),
        system_prompt_policy=config.normalize.system_prompt_policy,
        truncation=config.capture.truncation,
        max_seq_len=config.capture.max_seq_len,
        features_fingerprint=fp,
        topk=encoding_topk(config.capture.encoding, config.capture.topk),
        capture_backend=config.capture.backend,
    )


def read_regen_shard(path: Path) -> list[Sample]:
    """The ``sample_id, input_ids, loss_mask`` of a regen shard (footer and schema validated, and
    checked against the regen manifest's sha256 once that stage is finished)."""
    verify_files([path], rebuild="eagle3 regen")
    table = open_shard(path, schema=REGEN_INPUT_SCHEMA).read(columns=REGEN_INPUT_SCHEMA.names)
    rows = table.to_pydict()
    return [
        Sample(*row)
        for row in zip(rows["sample_id"], rows["input_ids"], rows["loss_mask"], strict=True)
    ]


def admit(
    samples: Sequence[Sample], *, max_seq_len: int, truncation: str
) -> tuple[list[Sample], list[dict]]:
    """Split samples into those to capture (truncated if the policy says so) and quarantined
    rows."""
    keep, quarantined = [], []
    for s in samples:
        n = len(s.input_ids or [])
        if n == 0 or s.loss_mask is None or len(s.loss_mask) != n:
            quarantined.append({"sample_id": s.sample_id, "reason": REASON_BAD_INPUT, "seq_len": n})
        elif n > max_seq_len and truncation == "quarantine":
            quarantined.append({"sample_id": s.sample_id, "reason": REASON_TOO_LONG, "seq_len": n})
        elif n > max_seq_len:
            keep.append(Sample(s.sample_id, s.input_ids[:max_seq_len], s.loss_mask[:max_seq_len]))
        else:
            keep.append(s)
    return keep, quarantined


def plan_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped into batches, longest first, each with ``count * max_len <= batch_tokens``
    padded tokens (a sample longer than ``batch_tokens`` gets a batch of its own). Ties keep input
    order (stable)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # longest first: the first sets the width
        width = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * width > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def _scan_parts(parts_dir: Path) -> tuple[list[Path], list[Path], set[str], int]:
    """Valid feature parts, valid quarantine parts, the sample ids they hold, and the next part
    number.

    Partial (``*.tmp``) and unreadable parts are deleted: they are redone, never trusted."""
    features, quarantine, done, next_k = [], [], set(), 0
    if not parts_dir.exists():
        return features, quarantine, done, next_k
    for path in sorted(parts_dir.iterdir()):
        match = _PART_RE.search(path.name)
        if match is None:
            path.unlink()
            continue
        schema = FEATURE_SCHEMA if match.group(1) == "shard" else CAPTURE_QUARANTINE_SCHEMA
        try:
            ids = open_shard(path, schema=schema).read(columns=["sample_id"]).column(0).to_pylist()
        except (ShardError, OSError, pa.ArrowInvalid):
            logger.warning("discarding unreadable capture part %s", path)
            path.unlink()
            continue
        (features if schema is FEATURE_SCHEMA else quarantine).append(path)
        done.update(ids)
        next_k = max(next_k, int(match.group(2)) + 1)
    return features, quarantine, done, next_k


def _capture_batch(
    backend: CaptureBackend,
    batch: Sequence[Sample],
    part: int,
    *,
    hidden_size: int,
    codecs: tuple[ColumnCodec, FinalCodec],
) -> Batch:
    """Forward one batch and queue its states' stored form (and their finiteness) to the host:
    nothing here waits for a GPU, so the next forward is queued while the writer waits for these
    copies (``eagle3.runtime.transfer``)."""
    aux_codec, last_codec = codecs
    to_host, states, finite = HostCopy(), [], ([], [])
    outputs = backend.forward([s.input_ids for s in batch])
    for sample, (aux, final) in zip(batch, outputs, strict=True):
        check_shapes(len(sample.input_ids), aux, final, hidden_size=hidden_size, codec=last_codec)
        finite[0].append(_finite(aux))
        finite[1].append(_finite(final.probs if isinstance(final, TopK) else final))
        states.append(
            (
                tuple(map(to_host, aux_codec.stored(aux))),
                tuple(map(to_host, stored_final(last_codec, final, backend))),
            )
        )
    # aux and last: maybe two GPUs
    flags = (to_host(torch.stack(finite[0])), to_host(torch.stack(finite[1])))
    to_host.record()
    samples = [
        {
            "sample_id": s.sample_id,
            "input_ids": s.input_ids,
            "loss_mask": s.loss_mask,
            "seq_len": len(s.input_ids),
        }
        for s in batch
    ]
    return Batch(part, samples, states, flags, to_host, tokens=sum(len(s.input_ids) for s in batch))


def _finite(x: torch.Tensor) -> torch.Tensor:
    """Whether every value of ``x`` is finite, as a bool on ``x``'s device (read by the writer:
    reading it here would wait for the GPU), from its min and max (NaN propagates into both): one
    reduction pass, ~7x cheaper than ``isfinite(x).all()``, which writes a bool per value
    (BENCHMARKS.md, "Capture overhead")."""
    return torch.isfinite(torch.stack(torch.aminmax(x))).all()


def _finished(
    config: PipelineConfig, index: int, out_dir: Path, n_input: int, fp: str
) -> dict | None:
    """The result of a shard already finished and valid, or None (and a stale/broken final file is
    deleted). The parts of a finished shard are deleted here too: the writer renames the shard
    before it removes them."""
    shard, quarantine, parts_dir = output_paths(out_dir, index)
    if not shard.exists():
        return None
    try:
        rows = open_shard(shard, schema=FEATURE_SCHEMA).metadata.num_rows
        q_rows = open_shard(quarantine, schema=CAPTURE_QUARANTINE_SCHEMA).metadata.num_rows
        same_stage = shard_metadata(shard).get("features_fingerprint") == fp
    except ShardError as exc:
        logger.warning("rebuilding feature shard %d: %s", index, exc)
        rows, q_rows, same_stage = -1, 0, False
    if same_stage and rows + q_rows == n_input and _hashes_recorded(out_dir, index):
        # a kill between the shard's rename and the rmtree: the parts are leftovers
        if parts_dir.exists():
            logger.info(
                "feature shard %d is finished; removing its leftover parts %s", index, parts_dir
            )
            remove_in_background(parts_dir)
        return {
            "shard_index": index,
            "path": str(shard),
            "rows": rows,
            "quarantined": q_rows,
            "skipped": True,
        }
    logger.warning(
        "feature shard %s does not validate (rows %d + quarantined %d of %d input rows, or a damaged "
        "page); rebuilding",
        shard,
        rows,
        q_rows,
        n_input,
    )
    shard.unlink()
    return None


def _hashes_recorded(out_dir: Path, index: int) -> bool:
    """Whether shard ``index``'s writer recorded its files' hashes, recording them now when a kill
    came between the shard's rename and its hashes (``hashes-NNNNN.json`` still ``{}``, or torn):
    the same record an unbroken run leaves, so the manifest lists the shard with its footer hash too
    (the loader then checks its pages, not all of its bytes at every start). Every page of both
    files is first read against the CRC32 its writer gave it; False (rebuild the shard) when one
    fails. A shard without the file (from before writers recorded hashes) keeps what the previous
    manifest lists."""
    path = out_dir / hashes_file_name(index)
    files = output_paths(out_dir, index)[:2]
    if not path.exists() or {f.name for f in files} <= _listed_in(path):
        return True
    infos = []
    for file in files:
        try:
            parquet = open_shard(file)
            for row_group in range(parquet.num_row_groups):
                parquet.read_row_group(row_group)
        except (ShardError, OSError, pa.ArrowInvalid) as exc:
            logger.warning("feature shard %d: %s does not read back (%s)", index, file.name, exc)
            return False
        size, rows = file.stat().st_size, parquet.metadata.num_rows
        infos.append(ShardInfo(file, rows, size, sha256_file(file), footer_sha256(file)))
    record_hashes(path, infos)
    logger.info(
        "feature shard %d: finished before its hashes were recorded; its pages check, hashes recorded",
        index,
    )
    return True


def _listed_in(path: Path) -> set[str]:
    """The file names a ``hashes-NNNNN.json`` lists (none when it does not parse)."""
    try:
        listed = json.loads(path.read_text())
    except ValueError:
        return set()
    return set(listed) if isinstance(listed, dict) else set()


def capture_shard(
    config: PipelineConfig,
    regen_shard: Path,
    out_dir: Path,
    *,
    backend: CaptureBackend | None = None,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Capture hidden states for one regen shard into ``out_dir/shard-NNNNN.parquet`` (same index).

    Returns a small dict: ``shard_index, path, rows, quarantined, tokens, skipped, seconds``. The
    hashes the writers computed as they wrote the files are in ``hashes-NNNNN.json`` beside them
    (for ``finalize_features``)."""
    started = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    index = shard_index_of(regen_shard)
    fp = out_dir.name
    samples = read_regen_shard(regen_shard)
    done = _finished(config, index, out_dir, len(samples), fp)
    if done is not None:
        logger.info("feature shard %d already captured (%d rows); skipping", index, done["rows"])
        return done
    keep, pre_quarantined = admit(
        samples, max_seq_len=config.capture.max_seq_len, truncation=config.capture.truncation
    )
    _, _, parts_dir = output_paths(out_dir, index)
    parts_dir.mkdir(exist_ok=True)
    footer = shard_footer(config, fp)
    done_parts, _, already, next_k = _scan_parts(parts_dir)
    todo = [s for s in keep if s.sample_id not in already]
    if already:
        logger.info(
            "shard %d: resuming, %d samples already captured, %d to go",
            index,
            len(already),
            len(todo),
        )
    backend = backend if backend is not None else shared_backend(config)
    writer = PartWriter(
        config,
        index,
        out_dir,
        footer,
        done_parts,
        _counted(progress, len(keep) - len(todo), len(keep)),
    )
    try:
        tokens = _run_batches(config, backend, todo, writer, next_k)
    except BaseException:
        writer.abort()
        raise
    result = writer.finish(pre_quarantined)
    return result | {
        "tokens": tokens,
        "skipped": False,
        "seconds": round(time.monotonic() - started, 3),
    }


def _counted(
    progress: ProgressFn | None, done_before: int, total: int
) -> Callable[[int, int], None] | None:
    """Per-batch (samples, tokens) increments turned into ``progress``'s running (done, total,
    tokens)."""
    if progress is None:
        return None
    counts = [done_before, 0]

    def report(samples: int, tokens: int) -> None:
        counts[0] += samples
        counts[1] += tokens
        progress(counts[0], total, counts[1])

    return report


def _run_batches(
    config: PipelineConfig,
    backend: CaptureBackend,
    todo: list[Sample],
    writer: PartWriter,
    first_part: int,
) -> int:
    """Forward ``todo`` in planned batches and hand each batch's rows to ``writer``; returns the
    tokens."""
    tokens = 0
    codecs = column_codecs(
        config.capture.encoding,
        config.capture.dtype,
        config.target.hidden_size,
        topk=config.capture.topk,
    )
    plan = plan_batches([len(s.input_ids) for s in todo], config.capture.batch_tokens)
    for k, batch_idx in enumerate(plan, start=first_part):
        raise_if_stopped(f"capture shard {writer.index}")
        captured = _capture_batch(
            backend,
            [todo[i] for i in batch_idx],
            k,
            hidden_size=config.target.hidden_size,
            codecs=codecs,
        )
        writer.submit(captured)
        tokens += captured.tokens
    return tokens


_BACKENDS: dict[tuple, CaptureBackend] = {}
_BACKENDS_LOCK = threading.Lock()


def shared_backend(config: PipelineConfig) -> CaptureBackend:
    """One backend per process and target/dtype/device/layers: shard tasks in threads share the
    loaded model."""
    capture = config.capture
    key = (
        capture.backend,
        config.target.model_path,
        config.target.revision,
        capture.dtype,
        capture.device,
        tuple(config.sglang_layer_ids),
        encoding_topk(capture.encoding, capture.topk),
        capture.sglang.model_dump_json() if capture.backend == "sglang" else None,
    )
    with _BACKENDS_LOCK:
        if key not in _BACKENDS:
            _BACKENDS[key] = make_backend(config)
        return _BACKENDS[key]
