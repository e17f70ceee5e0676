"""Secret blocks into the run's environment (``eagle3.runtime.secrets`` documents the order and the
rule).

A flow run calls ``load_secret_blocks`` once, when it resolves its config: each secret the config
names that the environment does not hold is read from its Prefect Secret block, if one exists, and
exported to this process (and so to the task runner's workers it starts afterwards). Library code
then reads the environment only, and no value ever travels as a parameter, so Prefect never records
one.
"""

from __future__ import annotations

import os

from prefect import get_run_logger
from prefect.blocks.system import Secret

from eagle3.config.pipeline import PipelineConfig
from eagle3.runtime.secrets import block_name, secret_names


def secret_from_block(env_name: str) -> str | None:
    """The value of ``env_name``'s Secret block, None when the server has no such block."""
    try:
        return str(Secret.load(block_name(env_name)).get())
    # no such block: the secret stays unset (optional ones) or comes from a later source
    except ValueError:
        return None


def load_secret_blocks(config: PipelineConfig) -> dict[str, str]:
    """Export the missing secrets that have a Secret block; returns ``{env name: where it came
    from}`` (no values)."""
    sources = {}
    for name in secret_names(config):
        if os.environ.get(name):
            sources[name] = "environment"
            continue
        value = secret_from_block(name)
        if value is not None:
            os.environ[name] = value
            sources[name] = f"Secret block {block_name(name)}"
    if sources:
        get_run_logger().info("secrets: %s", ", ".join(f"{k} from {v}" for k, v in sources.items()))
    return sources
