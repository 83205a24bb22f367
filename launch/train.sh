#!/usr/bin/env bash
# Plan, configure and launch a dstk training run. Every setting can be overridden from the environment:
#   MODEL=llama-7b CLUSTER=dgx-a100-80g NODES=2 GLOBAL_BATCH=256 STEPS=1000 ./launch/train.sh --data data/
# Extra arguments are passed to `dstk train` (after the launcher's `--`).
# SLURM_SCRIPT=job.sbatch writes an sbatch script for the same launch instead of running it (then: sbatch job.sbatch).
set -euo pipefail

MODEL="${MODEL:-tiny-gpt2}"
CLUSTER="${CLUSTER:-local}"
NODES="${NODES:-1}"
GLOBAL_BATCH="${GLOBAL_BATCH:-16}"
STEPS="${STEPS:-100}"
LR="${LR:-1e-3}"
RUN_DIR="${RUN_DIR:-runs/${MODEL}}"
CONFIG="${CONFIG:-${RUN_DIR}/ds_config.json}"
MASTER_PORT="${MASTER_PORT:-29500}"
MAX_RESTARTS="${MAX_RESTARTS:-0}"
DSTK="${DSTK:-dstk}"
SLURM_SCRIPT="${SLURM_SCRIPT:-}"

slurm_args=()
if [[ -n "${SLURM_SCRIPT}" ]]; then
  slurm_args=(--slurm "${SLURM_SCRIPT}")
fi

mkdir -p "${RUN_DIR}"
"${DSTK}" config --plan --model "${MODEL}" --cluster "${CLUSTER}" --nodes "${NODES}" \
  --global-batch "${GLOBAL_BATCH}" --lr "${LR}" --train-steps "${STEPS}" --log-dir "${RUN_DIR}/logs" \
  -o "${CONFIG}"
exec "${DSTK}" launch --cluster "${CLUSTER}" --nodes "${NODES}" --config "${CONFIG}" \
  --run-dir "${RUN_DIR}/launch" --master-port "${MASTER_PORT}" --max-restarts "${MAX_RESTARTS}" \
  ${slurm_args[@]+"${slurm_args[@]}"} -- \
  --model "${MODEL}" --steps "${STEPS}" --run-dir "${RUN_DIR}" --checkpoint-dir "${RUN_DIR}/checkpoints" \
  --resume auto "$@"
