#!/usr/bin/env bash
# COCO transfer on several GPUs: detectron2's launcher for the detectron2 engine, torchrun for the
# torchvision engine (the engine is chosen as tools/transfer_coco.py chooses it: --engine, else
# detectron2 when it is importable).
# Usage: tools/dist_transfer_coco.sh CKPT N [transfer_coco.py args]   (N: processes on this node,
# at most its GPUs, or its cores without CUDA)
# Multi-node: set NNODES, NODE_RANK, MASTER_ADDR (and PORT) on every node.
set -euo pipefail
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
cd "$(dirname "$0")/.."
export PYTHONPATH="$(pwd):${PYTHONPATH:-}"
# CKPT, N and the port checked first (one line each); no worker outlives the launcher.
python -m ifnd.launch check --usage 'tools/dist_transfer_coco.sh CKPT N [transfer_coco.py args]' \
    --nnodes "$NNODES" --addr "$MASTER_ADDR" --port "$PORT" -- "$@"

ENGINE=auto
ARGS=("${@:3}")
for ((i = 0; i < ${#ARGS[@]}; i++)); do
    case "${ARGS[$i]}" in
        --engine=*) ENGINE="${ARGS[$i]#--engine=}" ;;
        --engine) ENGINE="${ARGS[$((i + 1))]:-auto}" ;;
    esac
done
if [ "$ENGINE" = auto ]; then
    if python -c "import detectron2" >/dev/null 2>&1; then ENGINE=detectron2; else ENGINE=torchvision; fi
fi

if [ "$ENGINE" = detectron2 ]; then
    exec python -m ifnd.launch run python tools/transfer_coco.py "$1" --engine detectron2 \
        --num-gpus "$2" --num-machines "$NNODES" --machine-rank "$NODE_RANK" \
        --dist-url "tcp://$MASTER_ADDR:$PORT" "${@:3}"
fi
exec python -m ifnd.launch run python -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$2" --master_port="$PORT" \
    tools/transfer_coco.py "$1" --engine torchvision --launcher pytorch "${@:3}"
