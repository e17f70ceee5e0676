"""Accept length per domain on the aimed nights' held-out eval set, and the one shape it is read in.

**The shape (``by_set``).** ``{name: {"accept_length": float, "completion_tokens": int,
"spec_verify_ct": int, "prompts": int}}``: per prompt set (here, per domain) the accept length and
the counts it comes from (``sum(completion_tokens) / sum(spec_verify_ct)``, docs/DESIGN.md, "Accept
length"). The offline measurement below writes it; a gate report that carries per-set accept lengths
for an arm (a ``by_set`` mapping of this shape) can feed the planner through the same
``read_by_set``, with ``rename`` mapping its set names to domains.

**The offline measurement.** The draft and the target on CPU through the reference speculative
decoder (``eagle3.gate.offline_accept``, what ``eagle3 eval`` runs): each eval row's turns up to its
first answer, rendered with the project's chat template, greedy, ``scaling.eval_max_new_tokens``
tokens, EOS respected. It depends on no server, so it measures the same thing on every night
whatever the gate does, and its result is cached per draft content (``<selection>/eval/<draft
id>.json``): the champion measured after the night that trained it is not measured again when the
next night plans.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.config.pipeline import PipelineConfig
from eagle3.data.parquet import open_shard
from eagle3.data.schema import PROMPT_SCHEMA
from eagle3.registry import draft_id
from eagle3.rundir.runroot import atomic_write_json
from eagle3.scaling.selection import DomainPool, domain_of
from eagle3.target_io import load_causal_lm, load_tokenizer

logger = logging.getLogger(__name__)

EVAL_DIR = "eval"
BY_SET_FIELDS = ("accept_length", "completion_tokens", "spec_verify_ct", "prompts")


@dataclass(frozen=True)
class DomainAccept:
    accept_length: float
    completion_tokens: int
    spec_verify_ct: int
    prompts: int

    @property
    def tokens_per_prompt(self) -> float:
        return self.completion_tokens / self.prompts if self.prompts else 0.0


def read_by_set(
    by_set: Mapping[str, Mapping[str, Any]],
    *,
    rename: Mapping[str, str] | None = None,
    source: str = "by_set",
) -> dict[str, DomainAccept]:
    """Per-domain accept lengths from a ``by_set`` mapping (module docstring); ``rename``: set name
    -> domain."""
    out = {}
    for name, row in by_set.items():
        missing = [k for k in BY_SET_FIELDS if k not in row]
        if missing:
            raise ValueError(
                f"{source}: set {name!r} lacks {missing}; each set needs {list(BY_SET_FIELDS)}"
            )
        out[(rename or {}).get(name, name)] = DomainAccept(
            float(row["accept_length"]),
            int(row["completion_tokens"]),
            int(row["spec_verify_ct"]),
            int(row["prompts"]),
        )
    return out


def eval_prompts(config: PipelineConfig, eval_path: Path) -> dict[str, list[list[dict[str, str]]]]:
    """Each domain's eval prompts: a row's turns up to its first assistant turn."""
    rows = (
        open_shard(eval_path, schema=PROMPT_SCHEMA)
        .read(columns=["source", "meta", "messages"])
        .to_pylist()
    )
    out: dict[str, list[list[dict[str, str]]]] = defaultdict(list)
    for row in rows:
        turns = []
        for message in row["messages"]:
            if message["role"] == "assistant":
                break
            turns.append({"role": message["role"], "content": message["content"]})
        out[domain_of(row["source"], row["meta"], config.scaling.domain_key)].append(turns)
    return dict(sorted(out.items()))


def measure_offline(
    config: PipelineConfig, draft_dir: Path, eval_path: Path
) -> dict[str, dict[str, Any]]:
    """The draft's ``by_set`` over the eval set, one set per domain (CPU, reference speculative
    decoder)."""
    import torch

    from eagle3.data.template import render_prompt
    from eagle3.gate.offline_accept import evaluate_acceptance
    from eagle3.serve.reference.spec_decoder import SpeculativeDecoder

    tokenizer = load_tokenizer(config.target)
    target = load_causal_lm(config.target, dtype=getattr(torch, config.target.dtype))
    decoder = SpeculativeDecoder(target, tokenizer, Path(draft_dir), config.speculative.num_steps)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    by_set = {}
    for domain, prompts in eval_prompts(config, eval_path).items():
        ids = [render_prompt(tokenizer, turns) for turns in prompts]
        result = evaluate_acceptance(
            decoder, ids, max_new_tokens=config.scaling.eval_max_new_tokens, eos_ids=eos
        )
        by_set[domain] = {
            "accept_length": result["accept_length"],
            "completion_tokens": result["tokens"],
            "spec_verify_ct": result["verify_passes"],
            "prompts": result["prompts"],
        }
    return by_set


def domain_accept(
    config: PipelineConfig, draft_dir: Path, pool: DomainPool
) -> dict[str, DomainAccept]:
    """The draft's accept length per domain on the pool's eval set, measured once per draft
    content."""
    did = draft_id(Path(draft_dir))
    cache = pool.dir / EVAL_DIR / f"{did}.json"
    if not cache.exists():
        logger.info("measuring %s per domain on %s (offline, CPU)", draft_dir, pool.eval_path)
        by_set = measure_offline(config, Path(draft_dir), pool.eval_path)
        atomic_write_json(cache, {"draft": str(draft_dir), "draft_id": did, "by_set": by_set})
    return read_by_set(json.loads(cache.read_text())["by_set"], source=str(cache))
