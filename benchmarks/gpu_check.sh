#!/usr/bin/env bash
# The one prepared GPU check (#32): what a lent one-GPU machine should tell us, in one command of about 8
# minutes, as one results file (with a JSON of every record and a tarball of the logs) in $OUT (the device
# tool's folder) or in benchmarks/results/gpu_check_<date>/. From the repository root:
#
#   make gpu-wheels                          # here, once: the packages the GPU image lacks, as wheels in .whl
#   bash benchmarks/gpu_check.sh             # there (device tool: carry [".whl"]), or on any CUDA node
#   bash benchmarks/gpu_check.sh --cpu-smoke # here: every step on 2 CPU ranks at toy sizes, to try the script
#
# In order, each step timed, logged and allowed to fail without stopping the rest:
#   nvidia-smi dmon in the background for the whole check (power, clocks, utilization, throttling);
#   detection (dstk env, dstk plan --cluster local) while FusedAdam and cpu_adam build in the background;
#   dstk calibrate; the demo (`make demo` without its venv step: the image has no package registry);
#   benchmarks/hf_step.py: Llama-2-7B's block x 4 at 2048 tokens, bf16, ZeRO-1 and ZeRO-3, 50 steps each, every
#     step beside the calibrated prediction, the step time's trend, and the same config through the bare
#     DeepSpeed loop (benchmarks/minimal_loop.py) for the ratio dstk train / bare;
#   benchmarks/gpu_paths.py: the CUDA paths that had never run (asynchronous checkpoints and a resume, activation
#     offload, cpu_adam, FusedAdam, LoRA, a native MoE model at ep=1);
#   benchmarks/gpu_check_report.py: one Markdown file of it all.
set -u -o pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
SMOKE=0
[ "${1:-}" = "--cpu-smoke" ] && SMOKE=1
PY=${PYTHON:-python3}
if [ "$SMOKE" = 1 ] && [ -x .venv/bin/python ]; then PY=$REPO/.venv/bin/python; fi
DEST=${OUT:-$REPO/benchmarks/results/gpu_check_$(date +%Y-%m-%d)}
WORK=$(mktemp -d /tmp/dstk-gpu-check-XXXX)
mkdir -p "$DEST" "$WORK/logs" "$WORK/records"
T0=$(date +%s)

# The image has torch, transformers, peft, pyarrow and tensorboard, not deepspeed, pydantic or datasets: those
# travel as wheels (make gpu-wheels) and install under /tmp/site.
if ! "$PY" -c "import deepspeed, pydantic, datasets" 2> /dev/null; then
    if [ ! -d .whl ]; then
        echo "deepspeed is not importable and there is no .whl folder: run 'make gpu-wheels' here first" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        > "$WORK/logs/install.log" 2>&1 || tail -20 "$WORK/logs/install.log"
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$REPO
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline
export XDG_CACHE_HOME=$WORK/cache DSTK_CACHE_DIR=$WORK/dstk-cache TORCH_EXTENSIONS_DIR=$WORK/ext
# the image sets "9.0a", which DeepSpeed 0.19.8's JIT builder cannot parse (op_builder/builder.py:710)
export TORCH_CUDA_ARCH_LIST=9.0
if [ "$SMOKE" = 1 ]; then
    export CUDA_VISIBLE_DEVICES= DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
    export TORCH_EXTENSIONS_DIR=$REPO/.venv/torch_extensions
    HF=(--tiny --layers 1 --steps 8) PATHS_STEPS=6 PLAN_MODEL=gpt2
else
    HF=(--layers 4 --steps 50) PATHS_STEPS=12 PLAN_MODEL=llama-7b
fi

# step NAME TIMEOUT_S COMMAND...: its output in logs/NAME.log; its exit status and seconds in steps.tsv
step() {
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    echo "== $name ($((start - T0)) s into the check)"
    timeout "$limit" "$@" > "$WORK/logs/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - start))" >> "$WORK/steps.tsv"
    if [ "$rc" != 0 ]; then echo "   exit $rc:" && tail -4 "$WORK/logs/$name.log" | sed 's/^/   /'; fi
    return 0
}

DMON=
if [ "$SMOKE" = 0 ] && command -v nvidia-smi > /dev/null; then
    nvidia-smi -q > "$WORK/logs/nvidia-smi-q.log" 2>&1
    # p: power/temperature, u: utilization, c: clocks, v: violations (power/thermal throttle), m: memory
    nvidia-smi dmon -s pucvm -o T > "$WORK/logs/dmon.log" 2>&1 &
    DMON=$!
fi

step ops_build 300 "$PY" -c "
import time
from deepspeed.ops.op_builder import CPUAdamBuilder, FusedAdamBuilder
for b in (FusedAdamBuilder(), CPUAdamBuilder()):
    t = time.time(); b.load(); print(b.name, 'built in', round(time.time() - t, 1), 's', flush=True)" &
OPS=$!
step env 120 "$PY" -m toolkit.cli env
step plan 60 "$PY" -m toolkit.cli plan --model "$PLAN_MODEL" --cluster local --json
wait "$OPS"
step calibrate 240 "$PY" -m toolkit.cli calibrate --json
step demo 300 bash -c "cd '$WORK' && '$PY' -m toolkit.demo"
for stage in 1 3; do
    step "hf_step_zero$stage" 420 "$PY" benchmarks/hf_step.py "${HF[@]}" --zero-stage "$stage" --bare \
        --out-dir "$WORK/records" --tag "hf_step_zero$stage"
done
step gpu_paths 600 "$PY" benchmarks/gpu_paths.py --out "$WORK/records" --steps "$PATHS_STEPS"

if [ -n "$DMON" ]; then kill "$DMON" 2> /dev/null; fi
echo "== report ($(($(date +%s) - T0)) s into the check)"
"$PY" benchmarks/gpu_check_report.py --work "$WORK" --out "$DEST" --seconds "$(($(date +%s) - T0))"
tar -czf "$DEST/gpu_check_logs.tar.gz" -C "$WORK" logs records steps.tsv
echo "results: $DEST"
