"""Secrets (the HF token, regen server API keys): where they come from and the one rule that keeps
them out of every record.

A secret is named by an environment variable (``HF_TOKEN``, the config's ``regen.api_key_env``) and
is looked up,
in this order, when a run starts:

1. the environment of the process (a worker's, a shell's): a per-machine override always wins;
2. the Prefect Secret block ``eagle3-<name>`` (``HF_TOKEN`` -> ``eagle3-hf-token``): one place for a
   cluster, encrypted at rest by the Prefect server (``tasks.secrets`` copies it into the run's
   environment);
3. for ``HF_TOKEN`` only, the token ``hf auth login`` saved (``huggingface_hub``'s own lookup).

Configs, flow parameters, manifests and artifacts hold only the variable's *name*: values are read
from the environment at the moment of use and never logged, so the run root and the Prefect database
never see them.
"""

from __future__ import annotations

from eagle3.config.pipeline import PipelineConfig

HF_TOKEN = "HF_TOKEN"


def secret_names(config: PipelineConfig) -> list[str]:
    """The environment variables holding the secrets this config's run may use."""
    names = [HF_TOKEN]
    if config.regen.api_key_env:
        names.append(config.regen.api_key_env)
    return names


def block_name(env_name: str) -> str:
    """The Prefect Secret block that stands in for ``env_name`` (block names are lowercase with
    dashes)."""
    return "eagle3-" + env_name.lower().replace("_", "-")


def hf_token() -> str | None:
    """The Hugging Face token: ``HF_TOKEN`` (or its Secret block, exported at run start), else the
    one ``hf auth login`` saved."""
    from huggingface_hub import get_token

    return get_token()  # HF_TOKEN first, then the saved token
