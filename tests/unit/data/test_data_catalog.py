"""The dataset registry: lookups, errors that list the known names, tiers."""

from __future__ import annotations

import pytest

from eagle3.data import catalog
from eagle3.recipes import _HUB_MIX

RESEARCH_CATALOG = (
    "sharegpt",
    "ultrachat",
    "openthoughts",
    "perfect_blend",
    "infinity_instruct",
    "opencodeinstruct",
    "magpie",
    "openhermes",
    "tulu3",
    "slimorca",
    "capybara",
    "wildchat",
    "smoltalk",
)


def test_catalog_holds_the_research_datasets_and_generic_local_adapters():
    for name in (*RESEARCH_CATALOG, "jsonl", "parquet", "pretokenized"):
        entry = catalog.get(name)
        assert entry.name == name
    for name in RESEARCH_CATALOG:
        entry = catalog.get(name)
        assert entry.hub_id and entry.rows and entry.license and entry.domains


def test_recipe_adapter_names_are_registered():
    for name, _weight in _HUB_MIX:
        catalog.get(name)


def test_unknown_adapter_lists_the_known_ones():
    with pytest.raises(catalog.CatalogError) as err:
        catalog.get("sharegtp")
    assert "sharegpt" in str(err.value) and "ultrachat" in str(err.value)


def test_registering_a_name_twice_is_an_error():
    with pytest.raises(catalog.CatalogError, match="already registered"):
        catalog.register(catalog.DatasetEntry("sharegpt", "sharegpt"))


def test_tiers_follow_row_counts():
    assert catalog.get("infinity_instruct").tier == "mega"
    assert catalog.get("opencodeinstruct").tier == "mega"
    assert catalog.get("perfect_blend").tier == "large"
    assert catalog.get("tulu3").tier == "medium"
    assert catalog.get("jsonl").tier == "local"


def test_bad_entries_are_rejected_at_definition():
    with pytest.raises(ValueError, match="row_format"):
        catalog.DatasetEntry("x", "csv")
    with pytest.raises(ValueError, match="domain"):
        catalog.DatasetEntry("x", "messages", domains=("poetry",))


def test_table_rows_cover_every_entry():
    rows = catalog.table_rows()
    assert [r["name"] for r in rows] == catalog.names()
    assert {"hub_id", "license", "rows", "domains", "tier", "format"} <= set(rows[0])
