#!/usr/bin/env python
"""Usage: PREFECT_API_URL=http://host:4200/api python infra/zombie-automation.py [--heartbeat-s 60]
[--misses 3]

Creates (or updates) the automation that marks flow runs Crashed when their worker stops sending
heartbeats, for self-hosted Prefect servers (``deployments/deploy.py apply`` also does it). Workers
must emit heartbeats: ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` (``infra/prefect-worker.sh`` sets it
from ``EAGLE3_HEARTBEAT_S``) must match ``--heartbeat-s``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deployments.automations import ensure_zombie_automation


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Create the zombie flow-run automation on a self-hosted server."
    )
    parser.add_argument(
        "--heartbeat-s", type=int, default=60, help="the workers' heartbeat period in seconds"
    )
    parser.add_argument(
        "--misses", type=int, default=3, help="missed heartbeats before a run is marked Crashed"
    )
    args = parser.parse_args()
    automation = ensure_zombie_automation(heartbeat_s=args.heartbeat_s, misses=args.misses)
    print(f"automation {automation.name}: {automation.id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
