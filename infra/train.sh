#!/usr/bin/env bash
# Usage: infra/train.sh CONFIG_YAML FEATURES_DIR VOCAB_PATH OUT_DIR [extra args for python -m eagle3.train]
#
# Starts EAGLE-3 draft training workers with torchrun. Environment (defaults in brackets):
#   NPROC        processes per node [1]          NNODES     number of nodes [1]
#   NODE_RANK    this node's rank [0]            MASTER_ADDR rendezvous host [127.0.0.1]
#   MASTER_PORT  rendezvous port [29500]         TORCHRUN   torchrun executable [python -m torch.distributed.run]
# Multi-node: run the same command on every node with NNODES, NODE_RANK, MASTER_ADDR set; extra torchrun flags go
# in TORCHRUN_ARGS (e.g. TORCHRUN_ARGS="--max-restarts 3"). A rerun resumes from OUT_DIR/ckpt/latest.
set -euo pipefail

if [[ $# -lt 4 ]]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
CONFIG_YAML=$1 FEATURES=$2 VOCAB=$3 OUT=$4
shift 4

NPROC=${NPROC:-1}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
TORCHRUN=${TORCHRUN:-python -m torch.distributed.run}
read -r -a TORCHRUN_CMD <<< "$TORCHRUN"
read -r -a EXTRA <<< "${TORCHRUN_ARGS:-}"

exec "${TORCHRUN_CMD[@]}" \
  --nproc-per-node "$NPROC" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" "${EXTRA[@]}" \
  -m eagle3.train --config-yaml "$CONFIG_YAML" --features "$FEATURES" --vocab "$VOCAB" --out "$OUT" "$@"
