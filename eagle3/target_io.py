"""The one door to the target's files: its tokenizer (which carries its chat template), its HF
config, its weights.

Every load of the target in the library goes through here, and every one passes the target's
``revision`` and ``trust_remote_code`` (``eagle3.config.target.TargetConfig``): a target whose
tokenizer or config is custom code (an ``auto_map`` to a ``.py`` file beside the weights, as
Kimi-K2.5's tokenizer is) loads the same way in every stage, and a pinned revision is the one every
stage reads. A caller without a target config (the reference server, which serves a local directory
named by its flags) passes a ``TargetRef``.

* The tokenizer is cached per (path, revision, trust_remote_code), so a stage's units share one. A
  plain local one (a directory whose ``tokenizer_config.json`` names the fast ``tokenizers`` class
  and no custom code, with no revision asked for) is loaded as ``PreTrainedTokenizerFast``, the
  class AutoTokenizer would pick, without AutoTokenizer, whose config machinery imports torch and
  most of transformers (~10 s of a command's start on a busy machine): the regen command needs a
  tokenizer and HTTP, not a tensor library.
* The HF config and the weights are not cached: a caller may change what it gets.
* Nothing here imports transformers at module import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

# tokenizer_config.json classes that are the plain fast (``tokenizers``) tokenizer
_PLAIN_FAST = ("TokenizersBackend", "PreTrainedTokenizerFast")


class TargetSource(Protocol):
    """Where the target's files are and how to read them: ``TargetConfig`` is one, ``TargetRef``
    another."""

    @property
    def model_path(self) -> str: ...

    @property
    def revision(self) -> str | None: ...

    @property
    def trust_remote_code(self) -> bool: ...


@dataclass(frozen=True)
class TargetRef:
    """A target named without a pipeline config: a Hub id or a local directory."""

    model_path: str
    revision: str | None = None
    trust_remote_code: bool = False


def _plain_local(path: str, revision: str | None) -> bool:
    """Whether ``path`` is a local model directory whose config names the plain fast tokenizer and
    no custom code, with no revision asked for (a revision names a Hub commit: AutoTokenizer
    resolves it)."""
    config = Path(path) / "tokenizer_config.json"
    declared = json.loads(config.read_text()) if revision is None and config.is_file() else {}
    return declared.get("tokenizer_class") in _PLAIN_FAST and "auto_map" not in declared


def _unreadable(what: str, target: TargetSource, exc: OSError) -> OSError:
    return OSError(
        f"cannot load the target {what} from {target.model_path!r} ({exc}); set "
        "target.model_path to a local directory or a Hub id in the HF cache (HF_HUB_OFFLINE=1 "
        "needs it cached; gated repos need HF_TOKEN)"
    )


@lru_cache(maxsize=8)
def _tokenizer(model_path: str, revision: str | None, trust_remote_code: bool) -> Any:
    if _plain_local(model_path, revision):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(model_path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        model_path, revision=revision, trust_remote_code=trust_remote_code
    )


def load_tokenizer(target: TargetSource) -> Any:
    """The target's tokenizer (cached per process)."""
    try:
        return _tokenizer(target.model_path, target.revision, target.trust_remote_code)
    except OSError as exc:
        raise _unreadable("tokenizer", target, exc) from exc


def tokenizer_imports(target: TargetSource) -> tuple[str, ...]:
    """What ``load_tokenizer(target)`` imports from transformers (``Stage.unit_imports``)."""
    plain = _plain_local(target.model_path, target.revision)
    return ("transformers:PreTrainedTokenizerFast",) if plain else ("transformers:AutoTokenizer",)


def load_hf_config(target: TargetSource) -> Any:
    """The target's HF config (``AutoConfig``)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(
            target.model_path, revision=target.revision, trust_remote_code=target.trust_remote_code
        )
    except OSError as exc:
        raise _unreadable("config", target, exc) from exc


def load_causal_lm(target: TargetSource, *, dtype: Any, device_map: str | None = None) -> Any:
    """The target's weights as a transformers causal LM (``AutoModelForCausalLM``), in ``dtype``;
    ``device_map`` spreads it over devices (a transformers strategy such as ``auto``), None loads it
    on the CPU."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        target.model_path,
        revision=target.revision,
        dtype=dtype,
        device_map=device_map,
        trust_remote_code=target.trust_remote_code,
    )
