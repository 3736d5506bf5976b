#!/usr/bin/env bash
# Train with one process per GPU through torchrun; without CUDA, GPUS CPU processes over gloo.
# Usage: tools/dist_train.sh CONFIG GPUS [train.py args]
# Multi-node: set NNODES, NODE_RANK, MASTER_ADDR (and PORT) on every node.
set -euo pipefail
CONFIG=$1
GPUS=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
cd "$(dirname "$0")/.."
PYTHONPATH="$(pwd):${PYTHONPATH:-}" exec python -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" --master_port="$PORT" \
    tools/train.py "$CONFIG" --launcher pytorch "${@:3}"
