#!/usr/bin/env bash
# Usage: infra/dev.sh run  [eagle3 run args...]   set up .venv (idempotent), then `eagle3 run --recipe tiny`
#        infra/dev.sh test [pytest args...]       set up .venv (idempotent), SGLang's arg parser, Chromium and PostgreSQL
#                                                 (the UI test's Prefect server runs on it), then the whole test suite
#                                                 (CI); `-m 'not e2e'` skips the pipeline runs
#        infra/dev.sh setup                       only set up .venv
# Env: EAGLE3_VENV (default .venv), EAGLE3_EXTRAS (default dev,ray,multigpu,quantized: the local Ray cluster test,
#      the device_map capture tests and the INT4 target's capture tests run in CI),
# PIP_FIND_LINKS (a folder holding a CPU torch wheel, used when present; elsewhere torch resolves from the pyproject
# range, a CUDA build on GPU machines).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${EAGLE3_VENV:-.venv}
EXTRAS=${EAGLE3_EXTRAS:-dev,ray,multigpu,quantized}
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

sglang_parser() {
    # SGLang 0.5.23's own argument parser, so the launch-command test parses both arms of every recipe with it
    # (the full sglang extra pins CUDA builds). --no-deps into a folder the test puts on PYTHONPATH of a child
    # process only: ~1.2 GB, mostly triton; seconds from uv's cache, under a minute cold.
    local dir=.cache/sglang-parser stamp=.cache/sglang-parser/.installed want="sglang-0.5.23-v1"
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
    rm -rf "$dir"
    uv pip install --quiet --no-deps --target "$dir" "sglang==0.5.23" "pybase64==1.5.1" "triton==3.9.0" \
        "msgspec==0.23.0" "pyzmq==27.3.0" "ipython==9.18.1" "traitlets==5.16.1"
    echo "$want" > "$stamp"
}

system_packages() {
    # The Prefect UI test screenshots the flow-run page with Debian's Chromium, from a Prefect server on Debian's
    # PostgreSQL (the e2e fixtures start the cluster themselves through infra/prefect-server.sh; none runs as a
    # service). CI measured about a second for initdb + start + createdb on top of the apt install.
    local missing=()
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
    if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null
    fi
}

verb=${1:-}
shift || true
case "$verb" in
    setup) setup ;;
    run) setup; exec "$VENV/bin/eagle3" run --recipe tiny "$@" ;;
    test) setup; sglang_parser; system_packages; exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" ;;
    *) sed -n '2,7p' "$0"; exit 2 ;;
esac
