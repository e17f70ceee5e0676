"""The ``scaling`` section of the pipeline config: how a night picks what to regenerate.

``uniform`` is the original rule (the next whole prompt shards, in the pool's interleaved order).
``aimed`` holds a fixed eval set out of every domain, measures the champion's accept length per
domain on it and spends the night's budget where the expected gain per regenerated token is highest
(``eagle3.scaling.allocation``; the night's selection is ``eagle3.scaling.selection``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from eagle3.config.base import StrictModel


class ScalingConfig(StrictModel):
    """Night planning (docs/DESIGN.md, "Night planning"). Strict like every section (unknown keys
    are errors)."""

    policy: Literal["uniform", "aimed"] = Field(
        default="uniform",
        description="uniform: the next whole prompt shards (the pool's order); aimed: the budget split across "
        "domains by expected gain (traffic share x measured gain per token, with an exploration floor).",
    )
    aim: Literal["gain", "served"] = Field(
        default="gain",
        description="What aimed nights aim by: 'gain', the champion's accept length per domain "
        "on the eval set and the expected gain per token from the curve; 'served', the live "
        "draft's accept length per domain in the served sources' request logs (kept at every "
        "log level), the budget split by traffic share x headroom "
        "(eagle3.scaling.served_accept).",
    )
    served_domain_header: str = Field(
        default="x-smg-routing-key",
        description="aim=served: the request header that names a served request's domain "
        "(SGLang logs x-smg-routing-key and the headers in SGLANG_LOG_REQUEST_HEADERS); served "
        "rows record it as meta.route.",
    )
    domain_key: str = Field(
        default="source",
        description="What a domain is: 'source' (the dataset label of a prompt row) or 'meta.<key>' (a field of "
        "the row's meta JSON, e.g. meta.category; rows without it are domain 'unknown').",
    )
    budget_unit: Literal["prompts", "tokens"] = Field(
        default="prompts",
        description="What --scale counts under aimed: prompts, or regenerated tokens (each domain's rows costed "
        "at its measured tokens per row). uniform always counts prompts.",
    )
    floor: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Exploration floor: this fraction of the night's budget is split evenly over the domains with "
        "prompts left, so none starves while its gain is unmeasured.",
    )
    traffic: dict[str, float] = Field(
        default_factory=dict,
        description="Serving-traffic share per domain (weights, normalized over the pool's domains; a domain "
        "left out has share 0 and gets only the floor). Empty: every domain weighs the same.",
    )
    max_domain_share: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="aimed: no domain gets more than this fraction of a night's budget (floor included); 1: no "
        "cap. The plan table's 'bound by' column says cap where it bound.",
    )
    eval_per_domain: int = Field(
        default=16,
        gt=0,
        description="Held-out eval prompts per domain (at most a quarter of the domain's rows): never regenerated "
        "or trained on, fixed across nights for a prompts stage.",
    )
    eval_max_new_tokens: int = Field(
        default=64, gt=0, description="Tokens decoded per eval prompt."
    )
    eval_seed: int = Field(
        default=0, description="Which rows are held out (an order of sample-id hashes)."
    )

    @field_validator("domain_key")
    @classmethod
    def _known_key(cls, value: str) -> str:
        if value != "source" and not (value.startswith("meta.") and len(value) > len("meta.")):
            raise ValueError(
                f"scaling.domain_key={value!r}: use 'source' or 'meta.<key>' (e.g. meta.category)"
            )
        return value

    @field_validator("traffic")
    @classmethod
    def _positive_shares(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {name: share for name, share in value.items() if share < 0}
        if bad:
            raise ValueError(
                f"scaling.traffic has negative shares {bad}: give each domain a weight >= 0"
            )
        if value and sum(value.values()) <= 0:
            raise ValueError(
                "scaling.traffic sums to 0: give at least one domain a positive weight, or leave it empty"
            )
        return value
