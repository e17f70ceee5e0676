"""The ``regen`` section of the pipeline config (``eagle3.config.pipeline.PipelineConfig.regen``).

``ReasoningParser`` and ``ToolCallParser`` are the dialects ``eagle3.data.dialect`` registers (a
test keeps them equal), spelled as SGLang spells its parser flags.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from eagle3.config.base import StrictModel

ReasoningParser = Literal["kimi_k2"]
ToolCallParser = Literal["kimi_k2"]


class RegenConfig(StrictModel):
    """Regeneration through SGLang-compatible servers. No servers: the reference server is started
    locally."""

    servers: list[str] = Field(default_factory=list)
    api: Literal["generate", "openai"] = "generate"
    concurrency_per_server: int = Field(default=64, gt=0)
    # Shards regenerated at once in one run; each keeps concurrency_per_server requests on every
    # server, so a server sees shards_in_flight x concurrency_per_server. 1 keeps the knob exact
    # (measured: 4 shards at 8 each on an 8-slot server ran at 0.77-0.88 of one shard's tok/s);
    # raise it only to hide shard tails on very short shards.
    shards_in_flight: int = Field(default=1, gt=0)
    max_new_tokens: int = Field(default=2048, gt=0)
    temperature: float = Field(default=0.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = -1
    stop: list[str] = Field(default_factory=list)
    keep_truncated: bool = True
    answers: Literal["target", "source"] = Field(
        default="target",
        description="target: the target regenerates every answer (the point of the stage); "
        "source: the dataset's own answers are kept, rendered with the target's template, no "
        "server asked (the baseline that shows what regeneration is worth). In the fingerprint.",
    )
    max_turns: int | None = Field(
        default=None,
        gt=0,
        description="Regenerate at most this many turns of a conversation, its first ones (the "
        "row ends after the last regenerated reply; meta.turns_cut counts the turns left out); "
        "None: every turn. In the fingerprint.",
    )
    request_timeout_s: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=6, ge=0)
    backoff_base_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, gt=0)
    eject_after_failures: int = Field(default=5, gt=0)
    readmit_after_s: float = Field(default=30.0, gt=0)
    no_server_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="How long regen waits with no healthy server (probing every readmit_after_s, spending no "
        "retries) before its shards fail with one line naming the servers and their last error; raise it when a "
        "server restart takes longer.",
    )
    journal_fsync_every: int = Field(default=16, gt=0)
    api_key_env: str | None = None
    # Thinking, tool-calling targets (eagle3.data.dialect; SGLang's parser names)
    reasoning_parser: ReasoningParser | None = Field(
        default=None,
        description="Where a turn's thinking ends (as SGLang's --reasoning-parser): the thinking is kept in the "
        "history as the template's reasoning, and with api=openai it is joined back from reasoning_content.",
    )
    tool_call_parser: ToolCallParser | None = Field(
        default=None,
        description="How the target writes tool calls (as SGLang's --tool-call-parser): regenerated calls are kept "
        "as structured calls and the source's tool results are replayed against them. The server itself must run "
        "without one, so the call text stays in the output.",
    )
    thinking: bool | None = Field(
        default=None,
        description="The chat template's thinking switch (chat_template_kwargs, as SGLang takes it; the name "
        "comes from regen.reasoning_parser); None leaves the template's default. In the stage fingerprint.",
    )

    @field_validator("servers")
    @classmethod
    def _servers_are_urls(cls, servers: list[str]) -> list[str]:
        """Each server is an http(s) URL with a host, so a typo fails at load instead of as a dead
        server later."""
        from urllib.parse import urlparse

        for server in servers:
            url = urlparse(server)
            if url.scheme not in ("http", "https") or not url.hostname or " " in server:
                raise ValueError(
                    f"{server!r} is not a server URL; write http://HOST:PORT (e.g. http://10.0.0.5:30000)"
                )
        return servers

    @model_validator(mode="after")
    def _thinking_needs_a_parser(self) -> RegenConfig:
        if self.thinking is not None and self.reasoning_parser is None:
            raise ValueError(
                "regen.thinking needs regen.reasoning_parser (e.g. kimi_k2): it names the template's switch"
            )
        return self
