"""The dataset registry: one entry per source adapter name (a registry: the set of sources is open).

An entry says where a dataset lives on the Hub (id, config, split), how its rows are laid out
(``row_format``, converted by ``eagle3.data.adapters``), its license, approximate size, domain tags
and size tier. Recipes and configs refer to entries by name (``SourceConfig.adapter``); an unknown
name lists the known ones and registering a name twice is an error. Row counts are from the dataset
cards (approximate); discovery records the real ones.

Row formats:
  ``sharegpt``      a list of turns ``{"from", "value"}`` (human/gpt/...), optional ``system`` column; with function
                    calls: ``function_call`` and ``observation`` turns and a ``tools`` column
                    (LLaMA-Factory's layout)
  ``messages``      a list of turns ``{"role", "content"}`` (OpenAI style, ``tool_calls`` and ``tool`` results
                    included), also stored as JSON text, with an optional ``tools`` column
  ``pairs``         a list of ``{"input", "output"}`` exchanges (Capybara)
  ``columns``       one exchange in flat columns mapped by ``columns={"user": .., "assistant": .., "system": ..,
                    "id": ..}`` (instruction datasets, local Q/A files)
  ``auto``          generic local files: ``columns`` if a ``user`` column is mapped, else a ``messages`` or
                    ``conversations`` list in either turn style
  ``pretokenized``  ``input_ids`` + ``loss_mask`` already in the target's token space
  ``served``        SGLang request logs (``--log-requests-level 3 --log-requests-format json``):
                    the requests the target answered, as rows that skip regeneration
                    (``eagle3.data.served``)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

ROW_FORMATS: tuple[str, ...] = (
    "sharegpt",
    "messages",
    "pairs",
    "columns",
    "auto",
    "pretokenized",
    "served",
)
DOMAINS: tuple[str, ...] = ("chat", "code", "math", "reasoning", "agentic")
MEGA_ROWS = 5_000_000
LARGE_ROWS = 1_000_000


class CatalogError(KeyError):
    """An unknown or duplicate adapter name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class DatasetEntry:
    """A registered dataset adapter."""

    name: str
    row_format: str
    hub_id: str | None = None
    config: str | None = None
    split: str = "train"
    license: str = "unknown"
    rows: int | None = None
    domains: tuple[str, ...] = ("chat",)
    columns: dict[str, str] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self) -> None:
        if self.row_format not in ROW_FORMATS:
            raise ValueError(
                f"{self.name}: row_format {self.row_format!r} is not one of {ROW_FORMATS}"
            )
        unknown = [d for d in self.domains if d not in DOMAINS]
        if unknown:
            raise ValueError(f"{self.name}: unknown domain tags {unknown}; use {DOMAINS}")

    @property
    def tier(self) -> str:
        """mega (>= 5M rows), large (1-5M) or medium; local adapters are ``local``."""
        if self.rows is None:
            return "local"
        if self.rows >= MEGA_ROWS:
            return "mega"
        return "large" if self.rows >= LARGE_ROWS else "medium"


_REGISTRY: dict[str, DatasetEntry] = {}


def register(entry: DatasetEntry) -> DatasetEntry:
    if entry.name in _REGISTRY:
        raise CatalogError(
            f"dataset adapter {entry.name!r} is already registered; pick another name"
        )
    _REGISTRY[entry.name] = entry
    return entry


def get(name: str) -> DatasetEntry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise CatalogError(
            f"unknown dataset adapter {name!r}; known adapters: {', '.join(sorted(_REGISTRY))} "
            "(see `eagle3 datasets list`)"
        ) from None


def names() -> list[str]:
    return sorted(_REGISTRY)


def entries() -> list[DatasetEntry]:
    return [_REGISTRY[n] for n in names()]


def table_rows(items: Iterable[DatasetEntry] | None = None) -> list[dict[str, str]]:
    """The catalog as printable rows (``eagle3 datasets list``)."""
    out = []
    for e in items if items is not None else entries():
        out.append(
            {
                "name": e.name,
                "hub_id": e.hub_id or "(local)",
                "config/split": f"{e.config or '-'}/{e.split}",
                "format": e.row_format,
                "license": e.license,
                "rows": f"{e.rows:,}" if e.rows else "-",
                "domains": ",".join(e.domains),
                "tier": e.tier,
            }
        )
    return out


_SYS = {"system": "system"}
for _entry in (
    DatasetEntry(
        "sharegpt",
        "sharegpt",
        "anon8231489123/ShareGPT_Vicuna_unfiltered",
        license="apache-2.0",
        rows=94_145,
        description="ShareGPT conversations (Vicuna cleaned)",
    ),
    DatasetEntry(
        "ultrachat",
        "messages",
        "HuggingFaceH4/ultrachat_200k",
        split="train_sft",
        license="mit",
        rows=207_865,
        description="UltraChat 200K, multi-turn",
    ),
    DatasetEntry(
        "openthoughts",
        "sharegpt",
        "open-thoughts/OpenThoughts-114k",
        config="default",
        license="apache-2.0",
        rows=113_957,
        domains=("reasoning", "math", "code"),
        columns=_SYS,
    ),
    DatasetEntry(
        "perfect_blend",
        "sharegpt",
        "mlabonne/open-perfectblend",
        license="apache-2.0",
        rows=1_420_909,
        domains=("chat", "math", "code"),
        description="8 sources blended",
    ),
    DatasetEntry(
        "infinity_instruct",
        "sharegpt",
        "BAAI/Infinity-Instruct",
        config="7M",
        license="cc-by-sa-4.0",
        rows=7_449_106,
        domains=("chat", "code", "math"),
    ),
    DatasetEntry(
        "opencodeinstruct",
        "columns",
        "nvidia/OpenCodeInstruct",
        license="cc-by-4.0",
        rows=5_000_000,
        domains=("code",),
        columns={"user": "input", "assistant": "output", "id": "id"},
    ),
    DatasetEntry(
        "magpie",
        "sharegpt",
        "Magpie-Align/Magpie-Pro-1M-v0.1",
        license="llama3",
        rows=1_000_000,
        columns={"id": "uuid", "model": "model", "category": "task_category"},
    ),
    DatasetEntry(
        "openhermes",
        "sharegpt",
        "teknium/OpenHermes-2.5",
        license="unknown",
        rows=1_001_551,
        domains=("chat", "code", "math"),
        columns={"category": "category"},
    ),
    DatasetEntry(
        "tulu3",
        "messages",
        "allenai/tulu-3-sft-mixture",
        license="odc-by",
        rows=939_344,
        domains=("chat", "code", "math", "agentic"),
        columns={"id": "id"},
    ),
    DatasetEntry(
        "slimorca",
        "sharegpt",
        "Open-Orca/SlimOrca",
        license="mit",
        rows=517_982,
        domains=("chat", "reasoning"),
    ),
    DatasetEntry(
        "capybara",
        "pairs",
        "LDJnr/Capybara",
        license="apache-2.0",
        rows=16_006,
        columns={"messages": "conversation"},
    ),
    DatasetEntry(
        "wildchat",
        "messages",
        "allenai/WildChat-1M",
        license="odc-by",
        rows=837_989,
        columns={"messages": "conversation", "id": "conversation_hash", "model": "model"},
    ),
    DatasetEntry(
        "smoltalk",
        "messages",
        "HuggingFaceTB/smoltalk",
        config="all",
        license="apache-2.0",
        rows=1_043_917,
        domains=("chat", "math", "code"),
    ),
    DatasetEntry(
        "apigen_mt",
        "sharegpt",
        "Salesforce/APIGen-MT-5k",
        license="cc-by-nc-4.0",
        rows=5_000,
        domains=("agentic",),
        columns={"system": "system", "tools": "tools"},
        description="multi-turn tool use, ShareGPT with function_call/observation turns",
    ),
    DatasetEntry(
        "coderforge",
        "messages",
        "togethercomputer/CoderForge-Preview",
        config="trajectories",
        split="filtered_reward1",
        rows=155_144,
        domains=("code", "agentic"),
        columns={
            "messages": "messages",
            "tools": "tools",
            "id": "trajectory_id",
            "license": "license",
        },
        description="agentic coding (OpenHands) trajectories: OpenAI tool calls as JSON text, per-row license",
    ),
    DatasetEntry(
        "swe_agent",
        "messages",
        "nebius/SWE-agent-trajectories",
        license="cc-by-4.0",
        rows=80_036,
        domains=("code", "agentic"),
        columns={"messages": "trajectory", "id": "instance_id", "model": "model_name"},
        description="agentic coding (SWE-agent) trajectories: system/user/ai turns, commands written as text",
    ),
    DatasetEntry(
        "jsonl", "auto", description="local JSONL (one row per line) with a column mapping"
    ),
    DatasetEntry("json", "auto", description="local JSON array file with a column mapping"),
    DatasetEntry("parquet", "auto", description="local Parquet files with a column mapping"),
    DatasetEntry(
        "pretokenized",
        "pretokenized",
        description="input_ids + loss_mask in the target's token space",
    ),
    DatasetEntry(
        "served",
        "served",
        license="served",
        description="SGLang request logs of the target (level 3, JSON): its answered requests",
    ),
):
    register(_entry)
