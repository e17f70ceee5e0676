#!/usr/bin/env bash
# Usage: infra/prefect-worker.sh [cpu|gpu] [extra `prefect worker start` options]
#
# Starts a process worker on a work pool (created as type `process` if missing; `python deployments/deploy.py`
# also creates both pools). Run the `gpu` worker on a GPU node (capture, training, gate) and the `cpu` worker
# anywhere that reaches the SGLang servers (regeneration only drives HTTP clients). Flow runs emit heartbeats
# every EAGLE3_HEARTBEAT_S seconds so the zombie-run automation can mark runs of a dead worker Crashed.
# Every worker must mount the run root (the recipe's `root`) at the same path as the machine that ran
# `deployments/deploy.py apply`: each flow checks the root's id marker at start and fails at once without it.
# Secrets (HF_TOKEN, regen.api_key_env) come from this worker's environment or Prefect Secret blocks eagle3-<name>.
#
# Environment (defaults in brackets):
#   PREFECT_API_URL       the server's API (required), e.g. http://prefect-host:4200/api
#   EAGLE3_WORK_POOL      pool name [first argument, else cpu]     EAGLE3_WORKER_LIMIT  max concurrent runs [1]
#   EAGLE3_HEARTBEAT_S    flow-run heartbeat period in s [60]      EAGLE3_HOME          run roots and caches [~/.eagle3]
set -euo pipefail

POOL="${EAGLE3_WORK_POOL:-${1:-cpu}}"
shift || true
if [[ -z "${PREFECT_API_URL:-}" ]]; then
    echo "set PREFECT_API_URL to the server's API, e.g. export PREFECT_API_URL=http://prefect-host:4200/api" >&2
    exit 2
fi
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
export PREFECT_FLOWS_HEARTBEAT_FREQUENCY="${EAGLE3_HEARTBEAT_S:-60}"

exec prefect worker start --pool "$POOL" --type process --limit "${EAGLE3_WORKER_LIMIT:-1}" "$@"
