"""Which stage directory a config names: the fingerprint chain from the sources down to the draft.

Every stage directory is ``<root>/<stage dir>/<fingerprint>``, and each fingerprint is a function of
the resolved config and the upstream stage's fingerprint (catalog -> prompts -> regen -> features ->
vocab -> draft). A command that is not told where its input is asks :class:`Lineage` for the
directory the config names, and :func:`eagle3.rundir.layout.find_input` applies the one input rule
(explicit path wins; else the matching directory, which must be finished; else an error listing what
exists). Two configs in one run root therefore never read each other's stages, and nothing is picked
by modification time.

The vocab and draft fingerprints depend on the *content* of the finished features stage (nightly
runs add shards to one features directory), so they are computed from that directory, found first.
Where the trainer's features come from (``train.features``: stored, or online from the regen stage)
is one value, ``FeatureSource``: the night's is its capture plan's decision, handed on; a command
given none takes this config's (``Lineage.features``).

What regen reads depends on ``scaling.policy``: the prompts stage's shards (uniform), or the shards
the aimed nights selected from it (``select``, ``eagle3.scaling.selection``). Regen's input is named
``REGEN_INPUT``, resolved here, so a re-trigger of regen shards (``eagle3 regen``, the regen
deployment's ``shard_ids``) reads what the night read.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.data.discover import catalog_fingerprint
from eagle3.data.normalize import prompts_fingerprint
from eagle3.regen.plan import regen_fingerprint
from eagle3.rundir.layout import PLAN_FILE, REGEN_INPUT, VOCAB_FILE, find_input, stage_dir
from eagle3.scaling.selection import select_fingerprint

if TYPE_CHECKING:
    from eagle3.capture.stage import FeatureSource

# stage -> (the option that points at another directory, the command that produces it)
_HINTS: dict[str, tuple[str, str]] = {
    "normalize": ("--prompts", "eagle3 normalize"),
    "select": ("--prompts", "eagle3 run (an aimed night selects its rows)"),
    "regen": ("--regen-dir", "eagle3 regen"),
    "capture": ("--features", "eagle3 capture"),
    "vocab": ("--vocab", "eagle3 vocab"),
}


class Lineage:
    """The fingerprints a resolved config gives each stage (computed lazily, upstream first)."""

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config

    @cached_property
    def catalog_fp(self) -> str:
        return catalog_fingerprint(self.config)

    @cached_property
    def prompts_fp(self) -> str:
        return prompts_fingerprint(self.config, self.catalog_fp)

    @cached_property
    def select_fp(self) -> str:
        return select_fingerprint(self.config, self.prompts_fp)

    @property
    def regen_source(self) -> str:
        """The stage whose shards regen reads: ``normalize`` (uniform) or ``select`` (aimed)."""
        return "select" if self.config.scaling.policy == "aimed" else "normalize"

    @cached_property
    def regen_fp(self) -> str:
        return regen_fingerprint(
            self.select_fp if self.regen_source == "select" else self.prompts_fp, self.config
        )

    @cached_property
    def features_fp(self) -> str:
        # capture and vocab import torch: only when asked
        from eagle3.capture.shard import features_fingerprint

        return features_fingerprint(self.config, self.regen_fp)

    def vocab_fp(self, features: FeatureSource) -> str:
        from eagle3.train.vocab import vocab_fingerprint

        return vocab_fingerprint(self.config, features.samples_fingerprint())

    def features(self, given: FeatureSource | Path | str | None = None) -> FeatureSource:
        """Where the trainer's hidden states come from: ``given`` (a decision, or a features stage
        directory: its stored shards), else this config's ``train.features`` decided over its regen
        stage (``feature_source``): stored needs the finished features stage, online the planned
        regen stage."""
        # capture imports torch: only when asked
        from eagle3.capture.stage import FeatureSource, feature_source

        if isinstance(given, FeatureSource):
            return given
        if given is not None:
            return FeatureSource.stored(self.input("capture", Path(given)))
        source = feature_source(self.config, self.stage_dir("regen"))
        # the error naming the command to run first
        self.input("regen" if source.online else "capture")
        return source

    def stage_dir(self, stage: str) -> Path:
        """The directory of ``stage`` (normalize, regen or capture) this config names, finished or
        not."""
        fp = {
            "normalize": lambda: self.prompts_fp,
            "select": lambda: self.select_fp,
            "regen": lambda: self.regen_fp,
            "capture": lambda: self.features_fp,
        }[stage]()
        return stage_dir(self.config.root_path, stage, fp)

    def resolve_inputs(self, wanted: Mapping[str, str], given: Mapping[str, Any]) -> dict[str, Any]:
        """A stage's plan inputs: each ``wanted`` parameter (-> its upstream stage) is the given
        path or else the directory this config names (``input``); other given values pass through.
        Resolved in order, so a vocab follows the features directory resolved before it."""
        out = dict(given)
        for param, upstream in wanted.items():
            explicit = given.get(param)
            if upstream == "features":
                out[param] = self.features(explicit)
                continue
            given_path = Path(explicit) if explicit else None
            out[param] = self.input(upstream, given_path, features=out.get("features"))
        return out

    def input(
        self, stage: str, explicit: Path | None = None, *, features: FeatureSource | None = None
    ) -> Path:
        """The directory of ``stage`` that a downstream command reads (the input rule of
        ``eagle3.rundir.layout``).

        A regen stage counts once it is planned (``plan.json``; capture takes the shards that are
        ready); the others must be finished. The vocab's fingerprint needs where the features come
        from (``features``). ``REGEN_INPUT`` is the stage regen reads (``regen_source``).
        """
        stage = self.regen_source if stage == REGEN_INPUT else stage
        option, produce = _HINTS[stage]
        marker = PLAN_FILE if stage == "regen" else None
        if explicit is not None:
            explicit = explicit.parent if stage == "vocab" and explicit.is_file() else explicit
            found = find_input(
                self.config.root_path,
                stage,
                None,
                explicit=explicit,
                option=option,
                produce=produce,
                marker=marker,
            )
            return found / VOCAB_FILE if stage == "vocab" else found
        if stage == "vocab":
            fp = self.vocab_fp(features if features is not None else self.features())
        else:
            fp = self.stage_dir(stage).name
        found = find_input(
            self.config.root_path, stage, fp, option=option, produce=produce, marker=marker
        )
        return found / VOCAB_FILE if stage == "vocab" else found
