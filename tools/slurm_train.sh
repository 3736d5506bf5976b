#!/usr/bin/env bash
# Train on a SLURM cluster with one task per GPU.
# Usage: tools/slurm_train.sh PARTITION JOB_NAME CONFIG [train.py args]
# Environment: GPUS (total tasks, default 8), GPUS_PER_NODE (default 8), CPUS_PER_TASK (default 5),
# SRUN_ARGS (extra srun arguments). GPUS_PER_NODE=0: CPU tasks over gloo, TASKS_PER_NODE (default 1)
# of them per node.
# Requeue-safe: run it from a batch script submitted with `sbatch --requeue`; when SLURM starts the
# job again after a pre-emption (SLURM_RESTART_COUNT >= 1), train.py continues the work dir's run as
# `--resume auto` does, losing at most the epoch in flight.
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
if [ "$GPUS_PER_NODE" = 0 ]; then
    GRES=() TASKS_PER_NODE=${TASKS_PER_NODE:-1}
else
    GRES=(--gres=gpu:"$GPUS_PER_NODE") TASKS_PER_NODE=$GPUS_PER_NODE
fi
cd "$(dirname "$0")/.."
PYTHONPATH="$(pwd):${PYTHONPATH:-}" exec srun -p "$PARTITION" --job-name="$JOB_NAME" \
    "${GRES[@]}" --ntasks="$GPUS" --ntasks-per-node="$TASKS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 $SRUN_ARGS \
    python -u tools/train.py "$CONFIG" --launcher slurm "${@:4}"
