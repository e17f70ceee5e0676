"""The ``served`` section of the pipeline config: what served traffic (SGLang request logs) may
become.

It applies to every source whose adapter is ``served`` (``eagle3.data.served``) and to the gate's
served profile (``eagle3.gate.served_profile``). Filters drop a request before it is read as data;
what they drop is counted in the prompts manifest and quarantined without its content (a filter is
how a team keeps private traffic out).
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from eagle3.config.base import StrictModel


class ServedConfig(StrictModel):
    """Served traffic as training data and as the gate's profile."""

    keep_truncated: bool = Field(
        default=False,
        description="Keep requests that stopped at max_new_tokens (finish_reason length); by "
        "default they are quarantined as cut_short: their answers end where the client's budget "
        "did, not where the target would.",
    )
    drop_headers: list[str] = Field(
        default_factory=list,
        description="Drop a request logged with any of these headers (names, any case). SGLang "
        "logs only the headers named in SGLANG_LOG_REQUEST_HEADERS (and x-smg-routing-key).",
    )
    drop_patterns: list[str] = Field(
        default_factory=list,
        description="Drop a request whose prompt or answer text matches any of these regular "
        "expressions.",
    )
    hook: str | None = Field(
        default=None,
        description="A user filter 'package.module:function': called with each ServedRequest "
        "(eagle3.data.served_log), it returns None to keep the request or a short reason to "
        "drop it.",
    )
    held_out: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="The share of served requests set aside as the gate's served prompt set, "
        "never trained on: a request is held out when its key (rid and arrival time) hashes "
        "below this share, so it stays held out on every night whatever else the logs hold.",
    )

    @field_validator("drop_headers")
    @classmethod
    def _lower(cls, names: list[str]) -> list[str]:
        return [n.lower() for n in names]

    @field_validator("drop_patterns")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(
                    f"served.drop_patterns: {pattern!r} is not a regular expression ({exc})"
                ) from None
        return patterns

    @field_validator("hook")
    @classmethod
    def _hook_form(cls, hook: str | None) -> str | None:
        if hook is not None and (hook.count(":") != 1 or not all(hook.split(":"))):
            raise ValueError(f"served.hook {hook!r}: write it as 'package.module:function'")
        return hook
