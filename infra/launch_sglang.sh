#!/usr/bin/env bash
# Usage: infra/launch_sglang.sh [baseline|eagle3] [more `eagle3 launch-sglang` options]
#
# Starts one SGLang arm with the command generated from the pipeline config (never hand-typed), waits for /health
# and stops the server cleanly on Ctrl-C or SIGTERM. Set EAGLE3_LAUNCH_MODE=--print to only print the command.
#
# Environment (defaults in brackets):
#   EAGLE3_RECIPE       recipe name [llama3_8b]            EAGLE3_CONFIG   YAML config instead of the recipe []
#   EAGLE3_DRAFT        draft export dir for the eagle3 arm [the registry's champion]
#   EAGLE3_FLAVOUR      sglang | reference [sglang]       EAGLE3_PORT     port [server.port from the config]
#   EAGLE3_LAUNCH_MODE  --run | --print [--run]
set -euo pipefail

ARM="${1:-eagle3}"
shift || true
args=(launch-sglang --arm "$ARM" --flavour "${EAGLE3_FLAVOUR:-sglang}" "${EAGLE3_LAUNCH_MODE:---run}")
if [[ -n "${EAGLE3_CONFIG:-}" ]]; then args+=(--config "$EAGLE3_CONFIG"); else args+=(--recipe "${EAGLE3_RECIPE:-llama3_8b}"); fi
if [[ -n "${EAGLE3_DRAFT:-}" ]]; then args+=(--draft "$EAGLE3_DRAFT"); fi
if [[ -n "${EAGLE3_PORT:-}" ]]; then args+=(--port "$EAGLE3_PORT"); fi
exec eagle3 "${args[@]}" "$@"
