#!/usr/bin/env bash
# Usage: infra/prefect-server.sh [prefect server start options]   start a persistent Prefect server (API + UI)
#        infra/prefect-server.sh postgres                        only create/start the local PostgreSQL; print its URL
#        infra/prefect-server.sh stop-postgres                   stop the local PostgreSQL (fast shutdown)
#
# Long jobs (days of regeneration, nightly data scaling) need a real server: ephemeral mode loses most task-run
# records at exit, and SQLite serialises every write behind one lock, which concurrent workers and thousands of task
# runs turn into "database is locked" errors. So a cluster runs Prefect on PostgreSQL (EAGLE3_PREFECT_DB):
#   sqlite      [default] state in $PREFECT_HOME/prefect.db: zero set-up, right for the tiny run and one machine
#   local       Debian's PostgreSQL (apt-get install postgresql), started by this script: cluster in $EAGLE3_PG_DIR,
#               created on first use (initdb, a random password, database $EAGLE3_PG_DB), listening on loopback only
#   postgresql+asyncpg://user:password@host:5432/prefect   a PostgreSQL you run (managed, HA); given as-is to Prefect
#                                                          (PREFECT_API_DATABASE_CONNECTION_URL is honoured the same)
# A restarted server keeps every run, artifact and deployment. Telemetry is off (offline clusters).
# Then, on every machine that runs flows or the CLI:  export PREFECT_API_URL=http://<host>:<port>/api
#
# Environment (defaults in brackets):
#   EAGLE3_PREFECT_HOST   bind address [0.0.0.0]      EAGLE3_PREFECT_PORT  port [4200]
#   EAGLE3_PREFECT_PUBLIC_URL  URL browsers use to reach this server [http://<hostname>:<port>]
#   PREFECT_HOME          server state [$EAGLE3_HOME/prefect, EAGLE3_HOME defaults to ~/.eagle3]
#   EAGLE3_PG_DIR         local PostgreSQL: cluster, password and log [$EAGLE3_HOME/prefect-postgres]
#   EAGLE3_PG_PORT        its port [5433, beside a system cluster on 5432]    EAGLE3_PG_DB  database [prefect]
#   EAGLE3_PG_BIN         PostgreSQL binaries [newest /usr/lib/postgresql/*/bin]
# PostgreSQL refuses to run as root: as root the cluster belongs to the `postgres` user, which must be able to reach
# EAGLE3_PG_DIR (a home under /root is not reachable: point EAGLE3_PG_DIR elsewhere, e.g. /var/lib/eagle3-pg).
set -euo pipefail

HOME_DIR="${EAGLE3_HOME:-$HOME/.eagle3}"
PG_DIR="${EAGLE3_PG_DIR:-$HOME_DIR/prefect-postgres}"
PG_PORT="${EAGLE3_PG_PORT:-5433}"
PG_DB="${EAGLE3_PG_DB:-prefect}"

pg_bin() {
    local bin="${EAGLE3_PG_BIN:-}"
    if [[ -z "$bin" ]]; then
        bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
    fi
    if [[ -z "$bin" || ! -x "$bin/initdb" ]]; then
        echo "no PostgreSQL binaries found: apt-get install postgresql (or set EAGLE3_PG_BIN)" >&2
        exit 2
    fi
    echo "$bin"
}

as_pg() {  # run a PostgreSQL binary as the cluster's owner (postgres when we are root)
    if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_url() {
    echo "postgresql+asyncpg://postgres:$(cat "$PG_DIR/password")@127.0.0.1:${PG_PORT}/${PG_DB}"
}

init_cluster() {  # first use: a cluster owned by the server's user (or postgres), password auth on loopback only
    local bin=$1 pwfile="$PG_DIR/data.pw"
    mkdir -p "$PG_DIR"
    chmod 711 "$PG_DIR"
    (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$PG_DIR/password")
    cp "$PG_DIR/password" "$pwfile"
    if [[ "$(id -u)" == 0 ]]; then
        chown postgres "$pwfile"
        if ! runuser -u postgres -- test -x "$PG_DIR"; then
            rm -f "$pwfile"
            echo "PostgreSQL runs as user postgres, which cannot reach $PG_DIR: set EAGLE3_PG_DIR to a path it can" \
                "reach (e.g. /var/lib/eagle3-pg)" >&2
            exit 2
        fi
        install -d -o postgres -m 700 "$PG_DIR/data"
    fi
    as_pg "$bin/initdb" -D "$PG_DIR/data" -U postgres --pwfile="$pwfile" --auth-host=scram-sha-256 \
        --auth-local=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
}

ensure_postgres() {  # idempotent: create the cluster on first use, start it when down, create the database
    local bin started
    bin=$(pg_bin)
    started=$(date +%s%N)
    [[ -f "$PG_DIR/data/PG_VERSION" ]] || init_cluster "$bin"
    if ! as_pg "$bin/pg_ctl" -D "$PG_DIR/data" status >/dev/null 2>&1; then
        # Unix sockets off: the server is reached over loopback TCP with the password, from any user.
        as_pg "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/data/server.log" -w -t 120 start \
            -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=''" >/dev/null
    fi
    PGPASSWORD=$(cat "$PG_DIR/password") PGCONNECT_TIMEOUT=10 "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres \
        -d postgres -tAq -v ON_ERROR_STOP=1 -c "SELECT 1 FROM pg_database WHERE datname = '${PG_DB}'" \
        | grep -q 1 || PGPASSWORD=$(cat "$PG_DIR/password") "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres \
        "$PG_DB"
    local ms=$(( ($(date +%s%N) - started) / 1000000 ))
    echo "PostgreSQL ready on 127.0.0.1:${PG_PORT} (database ${PG_DB}) in ${ms} ms" >&2
}

case "${1:-}" in
    postgres) ensure_postgres; pg_url; exit 0 ;;
    stop-postgres)
        as_pg "$(pg_bin)/pg_ctl" -D "$PG_DIR/data" -m fast -w stop
        exit 0 ;;
esac

HOST="${EAGLE3_PREFECT_HOST:-0.0.0.0}"
PORT="${EAGLE3_PREFECT_PORT:-4200}"
PUBLIC_URL="${EAGLE3_PREFECT_PUBLIC_URL:-http://$(hostname -f 2>/dev/null || hostname):${PORT}}"

export PREFECT_HOME="${PREFECT_HOME:-$HOME_DIR/prefect}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
# Concurrency leases (deployment concurrency_limit=1, the per-regen-server slots) live in the server's memory by
# default: a server crash forgets them while the database still counts their slots as taken, so running flows are
# terminated (lease renewal: 410 Gone) and the next runs queue forever. On disk under PREFECT_HOME they survive a
# restart, and expired ones are reclaimed. (Several server replicas need prefect-redis's lease storage instead.)
export PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE="${PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE:-prefect.server.concurrency.lease_storage.filesystem}"
# The UI is served by this process but runs in the browser: it must be told where the API is when not on :4200
# or when browsers reach the server under another name.
export PREFECT_UI_API_URL="${PREFECT_UI_API_URL:-${PUBLIC_URL}/api}"
mkdir -p "$PREFECT_HOME"

DB="${EAGLE3_PREFECT_DB:-sqlite}"
case "$DB" in
    sqlite) db_note="SQLite in $PREFECT_HOME" ;;
    local) ensure_postgres; export PREFECT_API_DATABASE_CONNECTION_URL="$(pg_url)"
        db_note="local PostgreSQL 127.0.0.1:${PG_PORT}/${PG_DB} (cluster $PG_DIR)" ;;
    postgresql+asyncpg://*) export PREFECT_API_DATABASE_CONNECTION_URL="$DB"; db_note="PostgreSQL (given URL)" ;;
    *) echo "EAGLE3_PREFECT_DB must be sqlite, local or a postgresql+asyncpg:// URL, not ${DB%%://*}://..." >&2
        exit 2 ;;
esac
if [[ "$DB" == sqlite && "${PREFECT_API_DATABASE_CONNECTION_URL:-}" == postgresql* ]]; then
    db_note="PostgreSQL (PREFECT_API_DATABASE_CONNECTION_URL)"
fi

echo "Prefect server: UI ${PUBLIC_URL}  API ${PREFECT_UI_API_URL}  state ${db_note}" >&2
exec prefect server start --host "$HOST" --port "$PORT" --analytics-off "$@"
