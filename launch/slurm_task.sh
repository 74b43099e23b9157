#!/usr/bin/env bash
# One task of launch/gpu_slurm.sbatch: chooses the GPUs its process drives, then runs the command it is given.
#   slurm_task.sh COMMAND [ARG ...]
# JAX's SLURM detection gives a process the one GPU numbered SLURM_LOCALID, which is GPU 0 of a node's eight
# when a task holds the whole node. Here a task holds every GPU it sees, numbered from 0 as CUDA numbers those
# of CUDA_VISIBLE_DEVICES (SLURM's GPUs for the task), else the node's SLURM_GPUS_ON_NODE. With
# JAXLM_TASK_PER_GPU=1 a task holds one: its only visible GPU, else SLURM_LOCALID (JAX's choice). A
# JAX_LOCAL_DEVICE_IDS of your own wins. Where JAXLM_COORDINATOR is set, the process id is SLURM_PROCID.
set -euo pipefail
fail() { echo "slurm_task.sh: error: task ${SLURM_PROCID:-?}: $*" >&2; exit 2; }

visible=()
[ -z "${CUDA_VISIBLE_DEVICES:-}" ] || IFS=, read -ra visible <<< "$CUDA_VISIBLE_DEVICES"
if [ -n "${JAX_LOCAL_DEVICE_IDS:-}" ]; then
  :
elif [ "${JAXLM_TASK_PER_GPU:-0}" = 1 ]; then
  [ ${#visible[@]} -ne 1 ] || export JAX_LOCAL_DEVICE_IDS=0
else
  count=${#visible[@]}
  [ "$count" -gt 0 ] || count=${SLURM_GPUS_ON_NODE:-0}
  [[ $count =~ ^[1-9][0-9]*$ ]] || fail "no GPUs were given to it (CUDA_VISIBLE_DEVICES and SLURM_GPUS_ON_NODE \
are unset): ask for them with sbatch --gpus-per-node=N"
  JAX_LOCAL_DEVICE_IDS=$(seq -s, 0 $((count - 1)))
  export JAX_LOCAL_DEVICE_IDS
fi
if [ -n "${JAXLM_COORDINATOR:-}" ]; then
  export JAXLM_PROCESS_ID=${JAXLM_PROCESS_ID-$SLURM_PROCID}
fi
exec "$@"
