#!/usr/bin/env bash
# Train with one process per GPU through torchrun; without CUDA, N CPU processes over gloo.
# Usage: tools/dist_train.sh CONFIG N [train.py args]   (N: processes on this node, at most its
# GPUs, or its cores without CUDA)
# Multi-node: set NNODES, NODE_RANK, MASTER_ADDR (and PORT) on every node.
set -euo pipefail
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
cd "$(dirname "$0")/.."
export PYTHONPATH="$(pwd):${PYTHONPATH:-}"
# CONFIG, N and the port checked first (one line each); no worker outlives the launcher.
python -m ifnd.launch check --usage 'tools/dist_train.sh CONFIG N [train.py args]' \
    --nnodes "$NNODES" --addr "$MASTER_ADDR" --port "$PORT" -- "$@"
exec python -m ifnd.launch run python -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$2" --master_port="$PORT" \
    tools/train.py "$1" --launcher pytorch "${@:3}"
