"""Small helpers the data stages share: reading a catalog, the mix plan of a config, finished-stage stats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eagle3.config import PipelineConfig
from eagle3.data.mix import MixLine, plan_mix
from eagle3.runroot import Manifest

CATALOG_FILE = "catalog.json"


def load_catalog(catalog_dir: Path) -> dict[str, Any]:
    path = Path(catalog_dir) / CATALOG_FILE
    if Manifest.read(Path(catalog_dir)) is None or not path.exists():
        raise FileNotFoundError(f"{catalog_dir} is not a finished catalog stage; run `eagle3 discover` first")
    return json.loads(path.read_text())


def source_record(doc: dict[str, Any], label: str) -> dict[str, Any]:
    for record in doc["datasets"]:
        if record["name"] == label:
            return record
    known = [r["name"] for r in doc["datasets"]]
    raise KeyError(f"source {label!r} is not in the catalog (has {known}); rerun `eagle3 discover`")


def mix_lines(config: PipelineConfig, doc: dict[str, Any]) -> list[MixLine]:
    """The mix plan: rows planned per source from the catalog's available rows, weights and caps."""
    sources = [(s.label, source_record(doc, s.label)["rows"], s.weight, s.max_rows) for s in config.sources]
    return plan_mix(sources, total=config.mix.total)


def read_stage_stats(stage: Path) -> dict[str, Any] | None:
    """The stats of a finished stage directory (manifest written), or None when it is not done."""
    manifest = Manifest.read(Path(stage))
    return manifest.stats if manifest is not None else None
