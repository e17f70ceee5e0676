"""Hugging Face Hub access for discovery: revision resolution, split files, and dataset search.

Everything goes through ``huggingface_hub``'s own functions and cache layout
(``<HF_HOME>/hub/datasets--owner--name/{refs,snapshots}/``), so a cache filled by ``huggingface-cli
download`` or a previous online run resolves offline. Environment is read at call time (``HF_HOME``,
``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, ``HF_TOKEN``); tokens are never logged. Every failure names
the dataset and the fix.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from eagle3.config.data import SourceConfig
from eagle3.data.catalog import DatasetEntry
from eagle3.data.readers import DATA_SUFFIXES

_TRUE = ("1", "true", "yes", "on")
SIZE_RANGES = {  # Hub size_categories tag -> (low, high) rows
    "n<1K": (0, 1_000),
    "1K<n<10K": (1_000, 10_000),
    "10K<n<100K": (10_000, 100_000),
    "100K<n<1M": (100_000, 1_000_000),
    "1M<n<10M": (1_000_000, 10_000_000),
    "10M<n<100M": (10_000_000, 100_000_000),
    "100M<n<1B": (100_000_000, 1_000_000_000),
}


class HubError(RuntimeError):
    """A Hub dataset that cannot be resolved; the message says how to fix it."""


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in _TRUE


def cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def _repo(source: SourceConfig, entry: DatasetEntry) -> str:
    repo = source.hub_id or entry.hub_id
    if not repo:
        raise HubError(
            f"source {source.label!r}: adapter {entry.name!r} is local-only; set sources[].path"
        )
    return repo


def _fail(source: SourceConfig, repo: str, exc: Exception) -> HubError:
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    if isinstance(exc, LocalEntryNotFoundError) or offline():
        fix = (
            f"it is not in the HF cache at {cache_dir()} and HF_HUB_OFFLINE=1 forbids downloading: unset "
            f"HF_HUB_OFFLINE, or download it elsewhere (`huggingface-cli download --repo-type dataset {repo}`) and "
            "copy the cache, or set the source's `path` to local files"
        )
    elif isinstance(exc, (GatedRepoError, RepositoryNotFoundError)):
        fix = "it is gated, private or misspelled: accept its terms on the Hub and export HF_TOKEN, or fix hub_id"
    else:
        fix = "check the network, HF_TOKEN and the revision, or set the source's `path` to local files"
    return HubError(f"dataset {source.label!r} ({repo}): {type(exc).__name__}; {fix}")


def _snapshot(source: SourceConfig, repo: str, *, patterns: list[str] | None = None) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                repo,
                repo_type="dataset",
                revision=source.revision,
                cache_dir=cache_dir(),
                local_files_only=offline(),
                allow_patterns=patterns,
            )
        )
    # huggingface_hub raises many types (HTTP, cache, auth): all become one clear error
    except Exception as exc:
        raise _fail(source, repo, exc) from exc


def resolve_revision(source: SourceConfig, entry: DatasetEntry) -> str:
    """The commit sha the source's revision (default ``main``) points to."""
    repo = _repo(source, entry)
    if offline():
        return _snapshot(source, repo).name
    from huggingface_hub import HfApi

    try:
        return HfApi().dataset_info(repo, revision=source.revision).sha or ""
    except Exception as exc:  # see _snapshot
        raise _fail(source, repo, exc) from exc


def _has_data_suffix(name: str) -> bool:
    return Path(name).suffix.lower() in DATA_SUFFIXES


def resolve_hub(
    source: SourceConfig, entry: DatasetEntry, *, is_data: Callable[[str], bool] = _has_data_suffix
) -> dict[str, Any]:
    """id, revision sha, split, license and the local paths of the split's data files
    (downloaded if online); ``is_data`` says which file names are data (request logs for a
    served source)."""
    from eagle3.data.discover import split_files

    repo = _repo(source, entry)
    split, subset = source.split or entry.split, source.subset or entry.config
    license_ = entry.license
    patterns = None
    if not offline():
        from huggingface_hub import HfApi

        try:
            info = HfApi().dataset_info(repo, revision=source.revision, files_metadata=True)
        except Exception as exc:  # see _snapshot
            raise _fail(source, repo, exc) from exc
        license_ = str((info.card_data or {}).get("license") or license_)
        names = [s.rfilename for s in info.siblings or [] if is_data(s.rfilename)]
        root = Path("/")
        patterns = [
            str(p.relative_to(root))
            for p in split_files([root / n for n in names], root, split=split, subset=subset)
        ]
    snap = _snapshot(source, repo, patterns=patterns)
    data = [f for f in snap.rglob("*") if f.is_file() and is_data(f.name)]
    files = split_files(data, snap, split=split, subset=subset)
    return {
        "id": repo,
        "revision": snap.name,
        "split": split,
        "license": _card_license(snap) or license_,
        "files": [str(f) for f in files],
    }


def _card_license(snapshot: Path) -> str | None:
    readme = snapshot / "README.md"
    if not readme.exists():
        return None
    match = re.search(r"^license:\s*(\S+)", readme.read_text(errors="replace"), flags=re.MULTILINE)
    return match.group(1) if match else None


def _format_guess(record: dict[str, Any]) -> str:
    card = record.get("cardData") or record.get("card_data") or {}
    info = card.get("dataset_info") or {}
    infos = info if isinstance(info, list) else [info]
    names = {f.get("name") for i in infos for f in (i.get("features") or []) if isinstance(f, dict)}
    text = " ".join([record.get("id", ""), *record.get("tags", [])]).lower()
    if "input_ids" in names:
        return "pretokenized"
    if "conversations" in names or "sharegpt" in text:
        return "sharegpt"
    if "messages" in names or "conversation" in names:
        return "messages"
    if names & {"instruction", "input", "output", "prompt", "question"}:
        return "columns"
    return "unknown"


def candidate(record: dict[str, Any]) -> dict[str, Any]:
    """A search result: id, row range from the size tag, license, popularity and a row-format
    guess."""
    tags = record.get("tags", [])
    sizes = [
        SIZE_RANGES[t.split(":", 1)[1]]
        for t in tags
        if t.startswith("size_categories:") and t.split(":", 1)[1] in SIZE_RANGES
    ]
    low, high = max(sizes) if sizes else (None, None)
    licenses = [t.split(":", 1)[1] for t in tags if t.startswith("license:")]
    card_license = (record.get("cardData") or {}).get("license")
    lic = (
        licenses[0] if licenses else (card_license if isinstance(card_license, str) else "unknown")
    )
    downloads, likes = int(record.get("downloads") or 0), int(record.get("likes") or 0)
    return {
        "id": record["id"],
        "rows_low": low,
        "rows_high": high,
        "license": lic,
        "downloads": downloads,
        "likes": likes,
        "format": _format_guess(record),
        "score": round(math.log10(downloads + 1) + 0.5 * math.log10(likes + 1), 3),
    }


def rank_candidates(
    records: Iterable[dict[str, Any]],
    *,
    min_rows: int = 0,
    licenses: list[str] | None = None,
    limit: int = 20,
) -> list[dict[str, Any]]:
    """Filter (could hold >= ``min_rows`` by its size tag; license in ``licenses``) and rank by
    popularity, a known row format first among equals. Records are ``HfApi.list_datasets`` entries
    as dicts."""
    wanted = {x.lower() for x in licenses or []}
    out = []
    for record in records:
        c = candidate(record)
        if min_rows and (c["rows_high"] is None or c["rows_high"] < min_rows):
            continue
        if wanted and c["license"].lower() not in wanted:
            continue
        out.append(c)
    out.sort(key=lambda c: (-c["score"], c["format"] == "unknown", c["id"]))
    return out[:limit]


def search_hub(
    query: str, *, min_rows: int = 0, licenses: list[str] | None = None, limit: int = 20
) -> list[dict]:
    """Live search through ``HfApi.list_datasets`` (needs the network), ranked by
    ``rank_candidates``."""
    if offline():
        raise HubError(
            "dataset search needs the Hub: unset HF_HUB_OFFLINE (and set HF_TOKEN for gated sets)"
        )
    from dataclasses import asdict

    from huggingface_hub import HfApi

    try:
        found = HfApi().list_datasets(search=query, limit=500, full=True)
        records = [asdict(d) | {"cardData": getattr(d, "card_data", None) or {}} for d in found]
    except Exception as exc:  # network/auth errors of many types
        msg = f"dataset search for {query!r} failed ({type(exc).__name__}); check the network and HF_TOKEN"
        raise HubError(msg) from exc
    return rank_candidates(records, min_rows=min_rows, licenses=licenses, limit=limit)
