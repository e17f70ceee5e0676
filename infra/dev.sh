#!/usr/bin/env bash
# Usage: infra/dev.sh run  [eagle3 run args...]   set up .venv (idempotent), then `eagle3 run --recipe tiny`
#        infra/dev.sh test [pytest args...]       set up .venv (idempotent), the SGLang CPU runtime, Chromium and
#                                                 PostgreSQL (the UI test's Prefect server runs on it), then the whole
#                                                 test suite (CI); `-m 'not e2e'` skips the pipeline runs
#        infra/dev.sh sglang                      only set up the SGLang 0.5.23 CPU runtime ($EAGLE3_HOME/sglang-cpu)
#        infra/dev.sh setup                       only set up .venv
# `EAGLE3_SGLANG=1 infra/dev.sh run --set server.engine=sglang` runs the tiny night on real SGLang.
# Env: EAGLE3_VENV (default .venv), EAGLE3_EXTRAS (default dev,ray,multigpu,quantized,real: the
#      local Ray cluster test, the device_map capture tests, the INT4 target's capture tests and the
#      real world's build run in CI),
# PIP_FIND_LINKS (a folder holding a CPU torch wheel, used when present; elsewhere torch resolves from the pyproject
# range, a CUDA build on GPU machines).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${EAGLE3_VENV:-.venv}
EXTRAS=${EAGLE3_EXTRAS:-dev,ray,multigpu,quantized,real}
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

sglang_runtime() {
    # Real SGLang 0.5.23 on this CPU, in a venv of its own (its pins clash with the project's: a CUDA torch 2.14.1,
    # CUDA-only kernel packages). The CPU torch is kept (overrides.txt), the CUDA-only packages are left out
    # (excludes.txt), torchvision comes without its CUDA dependencies, and the project is installed editable
    # without its dependencies, so the runtime's interpreter imports the launcher and its kernel ports
    # (eagle3/serve/sglang_cpu: `python -m eagle3.serve.sglang_cpu.launch`). Bytecode is compiled once here: the
    # server then starts in ~35 s instead of 65-160 s. Used by the `sglang` tests and by `server.engine=sglang`.
    local dir="${EAGLE3_SGLANG_RUNTIME:-${EAGLE3_HOME:-$HOME/.eagle3}/sglang-cpu}"
    local stamp="$dir/.eagle3-runtime" want
    want="sglang-0.5.23-$(cat infra/sglang-cpu/*.txt | sha256sum | cut -c1-16)-$PWD"
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
    rm -rf "$dir"
    uv venv --quiet "$dir" --python python3
    local links=()
    [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "$PIP_FIND_LINKS" ] && links=(--find-links "$PIP_FIND_LINKS")
    VIRTUAL_ENV="$dir" uv pip install --quiet --compile-bytecode "${links[@]}" \
        --overrides infra/sglang-cpu/overrides.txt --excludes infra/sglang-cpu/excludes.txt "sglang==0.5.23"
    VIRTUAL_ENV="$dir" uv pip install --quiet --compile-bytecode --no-deps "torchvision==0.28.0"
    VIRTUAL_ENV="$dir" uv pip install --quiet --no-deps -e .
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
    run) setup; [ -n "${EAGLE3_SGLANG:-}" ] && sglang_runtime; exec "$VENV/bin/eagle3" run --recipe tiny "$@" ;;
    sglang) sglang_runtime; echo "SGLang CPU runtime: ${EAGLE3_SGLANG_RUNTIME:-${EAGLE3_HOME:-$HOME/.eagle3}/sglang-cpu}" ;;
    test) setup; export EAGLE3_HOME="${EAGLE3_HOME:-$PWD/.cache/eagle3-home}" EAGLE3_REQUIRE_SGLANG=1
        sglang_runtime; system_packages; exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" ;;
    *) sed -n '2,7p' "$0"; exit 2 ;;
esac
