#!/usr/bin/env bash
# Usage: infra/prefect-server.sh            start a persistent Prefect server (API + UI) in the foreground
#
# Long jobs (days of regeneration, nightly data scaling) need a real server: ephemeral mode loses most task-run
# records at exit. State lives in PREFECT_HOME (SQLite by default; set PREFECT_API_DATABASE_CONNECTION_URL for
# Postgres), so a restarted server keeps every run, artifact and deployment. Telemetry is off (offline clusters).
# Then, on every machine that runs flows or the CLI:  export PREFECT_API_URL=http://<host>:<port>/api
#
# Environment (defaults in brackets):
#   EAGLE3_PREFECT_HOST   bind address [0.0.0.0]      EAGLE3_PREFECT_PORT  port [4200]
#   EAGLE3_PREFECT_PUBLIC_URL  URL browsers use to reach this server [http://<hostname>:<port>]
#   PREFECT_HOME          server state [$EAGLE3_HOME/prefect, EAGLE3_HOME defaults to ~/.eagle3]
set -euo pipefail

HOST="${EAGLE3_PREFECT_HOST:-0.0.0.0}"
PORT="${EAGLE3_PREFECT_PORT:-4200}"
PUBLIC_URL="${EAGLE3_PREFECT_PUBLIC_URL:-http://$(hostname -f 2>/dev/null || hostname):${PORT}}"

export PREFECT_HOME="${PREFECT_HOME:-${EAGLE3_HOME:-$HOME/.eagle3}/prefect}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
# The UI is served by this process but runs in the browser: it must be told where the API is when not on :4200
# or when browsers reach the server under another name.
export PREFECT_UI_API_URL="${PREFECT_UI_API_URL:-${PUBLIC_URL}/api}"
mkdir -p "$PREFECT_HOME"

echo "Prefect server: UI ${PUBLIC_URL}  API ${PREFECT_UI_API_URL}  state ${PREFECT_HOME}" >&2
exec prefect server start --host "$HOST" --port "$PORT" --analytics-off "$@"
