"""The ``server`` section of the pipeline config: the engine of every server the pipeline starts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eagle3.config.base import StrictModel


class ServerLaunchConfig(StrictModel):
    """The engine of every server the pipeline starts, and the flags every arm shares (baseline and
    speculative must agree on all of them). ``engine`` ``sglang`` with ``device`` ``cpu`` is SGLang
    itself on this CPU, through the project's runtime (``infra/dev.sh sglang``;
    ``eagle3.serve.launch_commands``).

    ``max_running_requests`` is always passed to both arms: left unset, SGLang 0.5.23 caps a
    speculative server at 48 running requests (``python/sglang/srt/server_args.py``,
    ``ServerArgs._handle_speculative_decoding``) but leaves the baseline uncapped, so
    high-concurrency levels would compare different batch limits. 48 keeps SGLang's cap."""

    engine: Literal["reference", "sglang"] = "reference"
    device: Literal["cuda", "cpu"] = "cuda"
    host: str = "127.0.0.1"
    port: int = Field(default=30000, ge=0, lt=65536)
    tp: int = Field(default=1, gt=0)
    dtype: str = "auto"
    context_length: int | None = Field(default=None, gt=0)
    mem_fraction_static: float | None = Field(default=None, gt=0, le=1)
    max_running_requests: int = Field(default=48, gt=0)
    cuda_graph_max_bs: int | None = Field(default=None, gt=0)
    extra_args: list[str] = Field(default_factory=list)
    log_requests: str | None = Field(
        default=None,
        description="A directory: every server the pipeline starts logs each request and its "
        "answer there, as SGLang's --log-requests at level 3 in JSON writes them (the served "
        "source reads them back).",
    )
