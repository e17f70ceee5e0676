"""Discovery: resolve the configured sources into ``<root>/catalog/<fp>/catalog.json``.

Per source the catalog records id, revision, config, split, row format (detected and checked against
the adapter), license, files with sizes and row counts, and the total rows. Local paths (a file, a
directory of data files, or a glob) are read for schema and rows (Parquet footers, JSONL lines,
streamed JSON arrays). Hub ids resolve through ``huggingface_hub``: online, ``dataset_info`` gives
the revision sha, file list, sizes and license, and the split's data files are fetched into the HF
cache with ``snapshot_download`` (normalization reads them from there); offline
(``HF_HUB_OFFLINE=1``) the same call resolves the cached snapshot (``refs/<revision>``) without the
network.

The fingerprint covers what is cheap to probe: the sources' discovery fields plus each local file's
size and mtime, or the Hub revision sha; a second run with the same inputs is a manifest hit.
``DiscoverStage`` (``eagle3.data.stage``) runs it on the stage contract; the normalize stage reads
the catalog back here.
"""

from __future__ import annotations

import glob
import json
import logging
import re
from pathlib import Path
from typing import Any

from eagle3.config.data import SourceConfig
from eagle3.config.pipeline import PipelineConfig
from eagle3.data import catalog
from eagle3.data.adapters import TURN_LIST_KEYS
from eagle3.data.readers import DATA_SUFFIXES, RawRow, count_rows, file_problem, iter_rows
from eagle3.data.served import SERVED, check_provenance
from eagle3.data.served_log import LOG_NAME, SERVER_INFO_FILE, count_records, log_files, sniff
from eagle3.errors import DataError
from eagle3.rundir.layout import CATALOG_FILE
from eagle3.rundir.runroot import FileEntry, Manifest, atomic_write_json, fingerprint

logger = logging.getLogger(__name__)

DISCOVER_VERSION = "1"
_FIELDS = ("adapter", "path", "hub_id", "revision", "subset", "split", "columns", "name")
_TURN_FORMATS = {"sharegpt", "messages"}


class DiscoveryError(DataError):
    """A source that cannot be resolved; the message names the dataset and the fix (a data error:
    not retried, exit code 2)."""


def local_files(path: str) -> list[Path]:
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        files = [f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in DATA_SUFFIXES]
    else:
        files = [
            Path(f)
            for f in glob.glob(str(p), recursive=True)
            if Path(f).suffix.lower() in DATA_SUFFIXES
        ]
    return sorted(files)


def split_files(files: list[Path], root: Path, *, split: str, subset: str | None) -> list[Path]:
    """Data files of one config/split inside a snapshot; all data files when none is named after the
    split."""
    rel = [(f, f.relative_to(root).as_posix()) for f in files if ".cache" not in f.parts]
    if subset:
        inside = [(f, r) for f, r in rel if r.startswith(f"{subset}/") or f"/{subset}/" in f"/{r}"]
        rel = inside or rel
    pattern = re.compile(rf"(^|/|[-_.]){re.escape(split)}(-|\.|/|$)")
    matched = [f for f, r in rel if pattern.search(r)]
    return sorted(matched or [f for f, _ in rel])


def detect_formats(row: Any) -> set[str]:
    """Row formats a sample row fits (``columns`` whenever it has flat string columns)."""
    if not isinstance(row, dict):
        return set()
    found = {"pretokenized"} if "input_ids" in row else set()
    for key in TURN_LIST_KEYS:
        turns = row.get(key)
        if isinstance(turns, list) and turns and isinstance(turns[0], dict):
            first = turns[0]
            found |= {"sharegpt"} if "from" in first else {"messages"} if "role" in first else set()
            found |= {"pairs"} if "input" in first else set()
    if any(isinstance(v, str) for v in row.values()):
        found.add("columns")
    return found


def check_format(label: str, entry: catalog.DatasetEntry, columns: dict[str, str], row: Any) -> str:
    """The detected format name; raises when the source's rows do not fit its adapter."""
    found = detect_formats(row)
    fmt = entry.row_format
    if fmt == "auto":
        fmt = "columns" if "user" in columns else "turns"
    if fmt == "columns":
        ok = isinstance(row, dict) and columns.get("user") in row
    elif fmt in ("turns", "sharegpt", "messages"):
        ok = bool(found & _TURN_FORMATS) or bool(
            columns.get("messages") and columns["messages"] in (row or {})
        )
    else:
        ok = fmt in found
    if not ok:
        keys = sorted(row)[:12] if isinstance(row, dict) else type(row).__name__
        raise DiscoveryError(
            f"source {label!r}: rows look like {sorted(found) or 'nothing known'} (keys {keys}) but adapter "
            f"{entry.name!r} expects {fmt!r}; pick the matching adapter (`eagle3 datasets list`) or set "
            "columns (e.g. columns={'user': 'question', 'assistant': 'answer'})"
        )
    fitting = sorted(found & (_TURN_FORMATS | {fmt}))
    return fitting[0] if fitting else fmt


def _sample_row(label: str, files: list[Path]) -> Any:
    """The first readable row of the first file; raises naming the file when its first rows are all
    unreadable (not JSON at all) or it has none."""
    first: RawRow | None = None
    for raw in iter_rows(files[:1], batch_size=16):
        if raw.error is None:
            return raw.value
        first = first or raw
        if raw.index >= 20:
            break
    if first is None:
        raise DiscoveryError(
            f"source {label!r}: {files[0]} holds no rows; fix the file or remove it from sources"
        )
    kind = files[0].suffix.lstrip(".").upper()
    raise DiscoveryError(
        f"source {label!r}: {files[0]} does not start with readable rows ({first.error}: "
        f"{first.raw[:80]!r}); check that it is {kind} as its name says"
    )


def _require_files(label: str, files: list[Path], *, fix: str) -> list[Path]:
    """``files``, each readable as a whole (``file_problem``); raises naming every one that is
    not."""
    if not files:
        raise DiscoveryError(
            f"source {label!r}: no data files ({', '.join(DATA_SUFFIXES)}) found; {fix}"
        )
    problems = [p for f in files if (p := file_problem(f)) is not None]
    if problems:
        raise DiscoveryError(f"source {label!r}: " + "; ".join(problems))
    return files


def _describe_files(label: str, files: list[Path], *, fix: str) -> list[dict[str, Any]]:
    return [
        {"path": str(f), "bytes": f.stat().st_size, "rows": count_rows(f)}
        for f in _require_files(label, files, fix=fix)
    ]


def source_files(source: SourceConfig, entry: catalog.DatasetEntry) -> list[Path]:
    """The data files of a local source: request logs for a served source, else data files."""
    assert source.path is not None
    return log_files(source.path) if entry.row_format == SERVED else local_files(source.path)


def _probe(source: SourceConfig, entry: catalog.DatasetEntry) -> dict[str, Any]:
    """Cheap identity of a source for the fingerprint (no row counting)."""
    fields = source.model_dump(mode="json", include=set(_FIELDS))
    if source.path:
        files = source_files(source, entry)
        info = Path(source.path).expanduser() / SERVER_INFO_FILE
        files += [info] if entry.row_format == SERVED and info.is_file() else []
        return fields | {"files": [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]}
    from eagle3.data.hub import resolve_revision

    return fields | {"revision_sha": resolve_revision(source, entry)}


def _served_record(
    config: PipelineConfig, source: SourceConfig, entry: catalog.DatasetEntry
) -> dict[str, Any]:
    """A served source: its request-log files (local, or a Hub dataset of them), records counted
    by reading them once (``count_records``: requests are joined across files), and the
    provenance its ``server_info.json`` gives (``check_provenance``)."""
    label = source.label
    if source.path:
        root = Path(source.path).expanduser()
        extra = {"kind": "local", "id": source.path, "revision": None}
        files = _require_logs(label, log_files(root), fix=f"check sources path {source.path!r}")
    else:
        from eagle3.data.hub import resolve_hub

        hub = resolve_hub(source, entry, is_data=lambda name: LOG_NAME.match(name) is not None)
        paths = [Path(p) for p in hub.pop("files")]
        files = _require_logs(label, paths, fix=f"check that {hub['id']} holds *.log files")
        root, extra = files[0].parent, {"kind": "hub", **hub}
    described = [{"path": str(f), "bytes": f.stat().st_size} for f in files]
    server = check_provenance(config, root)
    keys = ("model_path", "revision", "chat_template")
    return {
        "name": label,
        "adapter": entry.name,
        "config": None,
        "split": source.split or entry.split,
        "license": entry.license,
        "format": SERVED,
        **extra,
        "files": described,
        "rows": count_records(files),
        "bytes": sum(f["bytes"] for f in described),
        "server": {k: server.get(k) for k in keys} if server else None,
    }


def _require_logs(label: str, files: list[Path], *, fix: str) -> list[Path]:
    if not files:
        raise DiscoveryError(
            f"source {label!r}: no request logs (<host>_<rank>.log[.YYYY-mm-dd_HH]) found; {fix}"
        )
    problems = [p for f in files if (p := sniff(f)) is not None]
    if problems:
        raise DiscoveryError(f"source {label!r}: " + "; ".join(problems))
    return files


def _record(
    config: PipelineConfig, source: SourceConfig, entry: catalog.DatasetEntry
) -> dict[str, Any]:
    if entry.row_format == SERVED:
        return _served_record(config, source, entry)
    label = source.label
    columns = {**entry.columns, **source.columns}
    base = {"name": label, "adapter": entry.name, "config": source.subset or entry.config}
    if source.path:
        files = _describe_files(
            label, local_files(source.path), fix=f"check sources path {source.path!r}"
        )
        extra = {
            "kind": "local",
            "id": source.path,
            "revision": None,
            "split": source.split or entry.split,
        }
        extra["license"] = entry.license
    else:
        from eagle3.data.hub import resolve_hub

        hub = resolve_hub(source, entry)
        fix = f"check split {hub['split']!r}/config {base['config']!r} of {hub['id']}"
        files = _describe_files(label, [Path(p) for p in hub.pop("files")], fix=fix)
        extra = {"kind": "hub", **hub}
    detected = check_format(
        label, entry, columns, _sample_row(label, [Path(f["path"]) for f in files])
    )
    rows = sum(f["rows"] for f in files)
    return (
        base
        | extra
        | {
            "format": detected,
            "files": files,
            "rows": rows,
            "bytes": sum(f["bytes"] for f in files),
        }
    )


def catalog_fingerprint(config: PipelineConfig) -> str:
    return fingerprint(
        DISCOVER_VERSION, [_probe(s, catalog.get(s.adapter)) for s in config.sources]
    )


def check_sources(config: PipelineConfig) -> None:
    """Fail fast, before any row is counted, on what no retry fixes: duplicate labels, unknown
    adapters, and a local source without data files or whose rows do not fit its adapter (both cheap
    to see; a Hub source's files are only fetched when the catalog is written, so its format is
    checked then)."""
    labels = [s.label for s in config.sources]
    dupes = sorted({n for n in labels if labels.count(n) > 1})
    if dupes:
        raise DiscoveryError(f"sources {dupes} appear twice; give each a distinct `name`")
    for s in config.sources:
        entry = catalog.get(s.adapter)
        if s.path and entry.row_format == SERVED:
            _require_logs(s.label, log_files(s.path), fix=f"check sources path {s.path!r}")
            check_provenance(config, Path(s.path).expanduser())
        elif s.path:
            files = _require_files(
                s.label, local_files(s.path), fix=f"check sources path {s.path!r}"
            )
            check_format(
                s.label, entry, {**entry.columns, **s.columns}, _sample_row(s.label, files)
            )


def write_catalog(config: PipelineConfig, out: Path) -> dict[str, Any]:
    """Resolve every configured source into ``out/catalog.json``, manifest written last; returns the
    stats."""
    records = [_record(config, s, catalog.get(s.adapter)) for s in config.sources]
    path = out / CATALOG_FILE
    atomic_write_json(path, {"fingerprint": out.name, "datasets": records})
    stats = {"datasets": len(records), "rows": sum(r["rows"] for r in records)}
    Manifest(
        "catalog", out.name, files=[FileEntry.of(path, rows=len(records), base=out)], stats=stats
    ).write(out)
    logger.info("catalog %s: %d datasets, %d rows", out, stats["datasets"], stats["rows"])
    return stats


def load_catalog(catalog_dir: Path) -> dict[str, Any]:
    path = Path(catalog_dir) / CATALOG_FILE
    if Manifest.read(Path(catalog_dir)) is None or not path.exists():
        raise FileNotFoundError(
            f"{catalog_dir} is not a finished catalog stage; run `eagle3 discover` first"
        )
    return json.loads(path.read_text())


def source_record(doc: dict[str, Any], label: str) -> dict[str, Any]:
    for record in doc["datasets"]:
        if record["name"] == label:
            return record
    known = [r["name"] for r in doc["datasets"]]
    raise KeyError(f"source {label!r} is not in the catalog (has {known}); rerun `eagle3 discover`")
