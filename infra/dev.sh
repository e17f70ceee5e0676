#!/usr/bin/env bash
# Usage: infra/dev.sh run  [eagle3 run args...]   set up .venv (idempotent), then `eagle3 run --recipe tiny`
#        infra/dev.sh test [pytest args...]       set up .venv (idempotent) and Chromium (for the Prefect UI test),
#                                                 then the whole test suite (CI); `-m 'not e2e'` skips the pipeline runs
#        infra/dev.sh setup                       only set up .venv
# Env: EAGLE3_VENV (default .venv), EAGLE3_EXTRAS (default dev,ray: the local Ray cluster test runs in CI),
# PIP_FIND_LINKS (a folder holding a CPU torch wheel, used when present; elsewhere torch resolves from the pyproject
# range, a CUDA build on GPU machines).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${EAGLE3_VENV:-.venv}
EXTRAS=${EAGLE3_EXTRAS:-dev,ray}
TORCH_VERSION=2.13.0
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false

setup() {
    if ! command -v uv >/dev/null 2>&1; then
        python3 -m pip install --quiet "uv>=0.5,<0.14"
    fi
    [ -x "$VENV/bin/python" ] || uv venv --quiet "$VENV" --python python3
    export VIRTUAL_ENV="$PWD/$VENV"
    local stamp="$VENV/.eagle3-installed"
    local want
    want="$(sha256sum pyproject.toml | cut -c1-16)-$EXTRAS"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
        local wheel=""
        if [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "$PIP_FIND_LINKS" ]; then
            wheel=$(ls "$PIP_FIND_LINKS"/torch-${TORCH_VERSION}+cpu-*.whl 2>/dev/null | head -1 || true)
        fi
        if [ -n "$wheel" ]; then
            uv pip install --quiet --find-links "$PIP_FIND_LINKS" "torch==${TORCH_VERSION}"
        fi
    fi
    uv pip install --quiet --compile-bytecode -e ".[$EXTRAS]"
    echo "$want" > "$stamp"
}

browser() {
    # The Prefect UI test screenshots the flow-run page with Debian's Chromium.
    if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null
    fi
}

verb=${1:-}
shift || true
case "$verb" in
    setup) setup ;;
    run) setup; exec "$VENV/bin/eagle3" run --recipe tiny "$@" ;;
    test) setup; browser; exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" ;;
    *) sed -n '2,7p' "$0"; exit 2 ;;
esac
