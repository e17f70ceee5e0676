"""Prefect deployments of the pipeline (docs/DESIGN.md, "Prefect usage"): nightly ``data-scaling``,
``regen`` re-triggers, ``gate``.

Usage (``PREFECT_API_URL`` pointing at ``infra/prefect-server.sh``'s server)::

    python deployments/deploy.py apply --recipe kimi_k2_5 --scale 10000 --cron "0 1 * * *" --timezone Europe/Paris
    infra/prefect-worker.sh gpu      # capture, train, gate, and the nightly orchestration
    infra/prefect-worker.sh cpu      # regeneration (HTTP clients against the SGLang servers)
    python deployments/deploy.py serve --recipe tiny   # no workers: this process runs the deployments itself

Design choices:

* Deployments use **module entrypoints** (``flows.pipeline.data_scaling``) on ``process`` work
  pools: the worker imports the installed package, no image or code storage. Kubernetes pools take
  the same deployments with an ``image`` job variable (README).
* ``data-scaling`` has ``concurrency_limit=1`` with the ENQUEUE strategy: a night that runs long
  makes the next one wait, never overlap on the same run root. ``regen`` is limited to one run too
  (re-triggers of shard subsets queue behind each other).
* Every deployment stores the recipe (a name or a YAML path) and the overrides, never a resolved
  config: the worker resolves them at run time (``eagle3.recipes.ConfigRef``), so no absolute run
  root or stale config is frozen at apply time; re-run ``apply`` only to change the recipe,
  overrides, schedule or pools.
* Work pools ``cpu`` and ``gpu`` (type ``process``), the zombie-run automation and one global
  concurrency limit per configured regen server (1 slot: one shard at a time per server across the
  nightly run and re-triggers, so ``regen.concurrency_per_server`` is the server's real in-flight
  bound) are created if missing, so ``apply`` is idempotent and safe to re-run after every upgrade.
* **Shared storage.** ``apply`` claims the run root (``eagle3.rundir.runroot``: created with its id
  marker at first use; run ``apply`` where the shared filesystem is mounted) and adds
  ``root_id=<id>`` to the deployments' overrides: a worker that does not see that root fails at flow
  start with the shared-storage message. Pooled flow runs store Prefect's persisted task results
  under ``<root>/.prefect-results`` (the job's environment), so a unit cached on one machine is a
  cache hit on every other one.
* Alerts (``--alert-webhook URL`` or ``--alert-block slack-webhook/ops``): an automation notifies
  when a nightly or regen run fails or crashes (``deployments.automations``); ``apply`` prints each
  automation it created or updated with its id, beside the deployments.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, WorkPoolCreate
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.schedules import Cron

# `python deployments/deploy.py`: make the repo importable like the installed package
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deployments.automations import (
    ensure_alert_automation,
    ensure_webhook_block,
    ensure_zombie_automation,
    notification_block_id,
)

logger = logging.getLogger(__name__)


@dataclass
class DeploySpec:
    """What the deployments run and where; every field is a command-line option of ``deploy.py``."""

    recipe: str = "tiny"
    overrides: list[str] = field(default_factory=list)
    scale: int | None = None
    cron: str = "0 2 * * *"
    timezone: str = "UTC"
    paused: bool = False
    cpu_pool: str = "cpu"
    gpu_pool: str = "gpu"
    name: str | None = None  # deployment name; default: the recipe name
    # a URL: the ``eagle3-alerts`` webhook block is created/updated with it
    alert_webhook: str | None = None
    alert_block: str | None = None  # an existing notification block, ``<type slug>/<name>``

    @property
    def deployment_name(self) -> str:
        return self.name or self.recipe


def build_deployments(
    spec: DeploySpec, *, with_pools: bool = True, job_env: dict[str, str] | None = None
) -> list[RunnerDeployment]:
    """The three deployments; ``with_pools=False`` for ``serve`` (the serving process runs them
    itself). ``job_env`` is the environment of every pooled flow run (``shared_storage_env``)."""
    from flows.gate import gate_flow
    from flows.pipeline import data_scaling
    from flows.regen import regen_flow

    def pool(name: str) -> dict[str, Any]:
        if not with_pools:
            return {}
        return {
            "work_pool_name": name,
            "entrypoint_type": EntrypointType.MODULE_PATH,
            "job_variables": {"env": dict(job_env or {})},
        }

    one_at_a_time = ConcurrencyLimitConfig(
        limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE
    )
    name = spec.deployment_name
    # a ConfigRef: resolved on the worker per run
    config = {"recipe": spec.recipe, "overrides": spec.overrides}
    return [
        data_scaling.to_deployment(
            name,
            schedules=[Cron(spec.cron, timezone=spec.timezone)],
            paused=spec.paused,
            concurrency_limit=one_at_a_time,
            parameters={"recipe": spec.recipe, "overrides": spec.overrides, "scale": spec.scale},
            description=f"Nightly data scaling of recipe {spec.recipe!r}: +{spec.scale or 'all'} prompts a night.",
            tags=["eagle3", "nightly", spec.recipe],
            **pool(spec.gpu_pool),
        ),
        regen_flow.to_deployment(
            name,
            concurrency_limit=one_at_a_time,
            parameters={"config": config, "shard_ids": None},
            description="Regenerate prompt shards; re-trigger a few with --param shard_ids='[3,17]'.",
            tags=["eagle3", "regen", spec.recipe],
            **pool(spec.cpu_pool),
        ),
        gate_flow.to_deployment(
            name,
            parameters={"config": config},
            description="Gate drafts on demand: --param drafts='[\"<root>/drafts/<fp>/export\"]'.",
            tags=["eagle3", "gate", spec.recipe],
            **pool(spec.gpu_pool),
        ),
    ]


def _create_unless_present(
    read: Callable[[], object], create: Callable[[], object], what: str
) -> None:
    """Create ``what`` unless ``read`` finds it. Another process can create it between the read and
    the create (a worker started meanwhile, ``prefect worker start --pool P --type process``,
    creates its pool; another ``apply``): that 409 means it exists, as wanted (seen in the e2e
    suite)."""
    try:
        read()
        return
    except ObjectNotFound:
        pass
    try:
        create()
        logger.info("created %s", what)
    except ObjectAlreadyExists:
        logger.info("%s was created meanwhile by another process; kept", what)


def ensure_work_pools(names: Sequence[str]) -> None:
    """Create each ``process`` work pool that does not exist yet (existing pools are left as they
    are)."""
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    with get_client(sync_client=True) as client:
        for name in dict.fromkeys(names):
            pool = WorkPoolCreate(name=name, type="process", base_job_template=template)
            _create_unless_present(
                partial(client.read_work_pool, name),
                partial(client.create_work_pool, pool),
                f"process work pool {name!r}",
            )


def ensure_server_limits(servers: Sequence[str]) -> list[str]:
    """Create the 1-slot global concurrency limit of each regen server that has none; returns the
    limit names."""
    from eagle3.regen.stage import server_limit_names

    names = server_limit_names(list(servers))
    with get_client(sync_client=True) as client:
        for name in names:
            limit = GlobalConcurrencyLimitCreate(name=name, limit=1)
            _create_unless_present(
                partial(client.read_global_concurrency_limit_by_name, name),
                partial(client.create_global_concurrency_limit, limit),
                f"global concurrency limit {name!r} (1 shard at a time)",
            )
    return names


def claim_shared_root(spec: DeploySpec) -> tuple[DeploySpec, dict[str, str]]:
    """The spec with ``root_id=<the run root's id>`` among its overrides (the root is claimed here
    unless the overrides name an id already) and the pooled runs' environment that puts Prefect
    results under the root."""
    from eagle3.recipes import resolve
    from eagle3.rundir.runroot import RESULTS_DIR, check_run_root

    config = resolve(spec.recipe, spec.overrides)
    root_id = check_run_root(config.root_path, config.root_id)
    if config.root_id is None:
        spec = replace(spec, overrides=[*spec.overrides, f"root_id={root_id}"])
    logger.info(
        "run root %s (id %s) must be mounted at that path on every worker",
        config.root_path,
        root_id,
    )
    return spec, {"PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(config.root_path / RESULTS_DIR)}


def apply(spec: DeploySpec, *, zombie_automation: bool = True) -> dict[str, str]:
    """Register the deployments on the server (pools, limits and automation first), then the alert
    automation when a notification target is given; returns ``{flow/name: id}`` plus
    ``automation/<name>: id`` for each automation."""
    ensure_work_pools([spec.cpu_pool, spec.gpu_pool])
    from eagle3.recipes import resolve

    ensure_server_limits(resolve(spec.recipe, spec.overrides).regen.servers)
    ids = {}
    if zombie_automation:
        zombie = ensure_zombie_automation()
        ids[f"automation/{zombie.name}"] = str(zombie.id)
    spec, job_env = claim_shared_root(spec)
    for deployment in build_deployments(spec, job_env=job_env):
        deployment_id = deployment.apply(work_pool_name=deployment.work_pool_name)
        ids[f"{deployment.flow_name}/{deployment.name}"] = str(deployment_id)
    block_id = _alert_block(spec)
    if block_id is not None:
        watched = [ids[f"{flow}/{spec.deployment_name}"] for flow in ("data-scaling", "regen")]
        alert = ensure_alert_automation(spec.deployment_name, watched, block_id)
        ids[f"automation/{alert.name}"] = str(alert.id)
    for full_name, object_id in ids.items():
        logger.info("%s: %s", full_name, object_id)
    return ids


def _alert_block(spec: DeploySpec) -> UUID | None:
    """The notification block the alerts go through: an existing one (``--alert-block``), or the
    webhook block ``--alert-webhook`` creates; None when neither is given (no alert automation)."""
    if spec.alert_block and spec.alert_webhook:
        raise SystemExit("error: give --alert-block or --alert-webhook, not both")
    if spec.alert_block:
        return notification_block_id(spec.alert_block)
    return ensure_webhook_block(spec.alert_webhook) if spec.alert_webhook else None


def serve_forever(spec: DeploySpec) -> None:
    """Serve the deployments from this process (no work pools or workers needed); blocks until
    interrupted."""
    from prefect import serve

    serve(*build_deployments(spec, with_pools=False), limit=1)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", choices=("apply", "serve"), default="apply")
    parser.add_argument("--recipe", default=DeploySpec.recipe)
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override a.b=value"
    )
    parser.add_argument(
        "--scale", type=int, default=None, help="new prompts per night (default: all at once)"
    )
    parser.add_argument("--cron", default=DeploySpec.cron, help="nightly schedule (cron syntax)")
    parser.add_argument(
        "--timezone", default=DeploySpec.timezone, help="IANA timezone of the cron schedule"
    )
    parser.add_argument("--paused", action="store_true", help="create the nightly schedule paused")
    parser.add_argument("--cpu-pool", default=DeploySpec.cpu_pool)
    parser.add_argument("--gpu-pool", default=DeploySpec.gpu_pool)
    parser.add_argument("--name", default=None, help="deployment name (default: the recipe name)")
    parser.add_argument(
        "--no-zombie-automation", action="store_true", help="skip the zombie-run automation"
    )
    parser.add_argument(
        "--alert-webhook",
        default=None,
        help="URL to POST a Slack-compatible alert to when a "
        "nightly or regen run fails or crashes (saved as the webhook block eagle3-alerts)",
    )
    parser.add_argument(
        "--alert-block",
        default=None,
        help="an existing notification block for the alerts, "
        "<type slug>/<name>, e.g. slack-webhook/ops",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    spec = DeploySpec(
        recipe=args.recipe,
        overrides=list(args.overrides),
        scale=args.scale,
        cron=args.cron,
        timezone=args.timezone,
        paused=args.paused,
        cpu_pool=args.cpu_pool,
        gpu_pool=args.gpu_pool,
        name=args.name,
        alert_webhook=args.alert_webhook,
        alert_block=args.alert_block,
    )
    if args.mode == "serve":
        serve_forever(spec)
        return 0
    for full_name, deployment_id in apply(
        spec, zombie_automation=not args.no_zombie_automation
    ).items():
        print(f"{full_name}\t{deployment_id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
