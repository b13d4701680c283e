#!/usr/bin/env bash
# bench/engine.py on a GPU machine (issue 3), one model per call (fits a 10-minute call):
#   bench/gpu_engine.sh 0.6b [extra bench/engine.py args]
# GPU_TESTS=1 first runs the GPU-only tests; REF=1 then runs the official reference at the same size.
# Setup: bench/gpu_env.sh. Results: $OUT/engine-<size>.json
set -uo pipefail
size=${1:?0.6b or 1.7b}; shift
out=${OUT:-/tmp/out}; mkdir -p "$out"
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
gpu_tests
ck=/tmp/ck-$size
log "checkpoint $size"; python3 -m talkgate checkpoint create "$ck" --preset "$size" --variant custom_voice | tail -1
log "bench/engine.py $*"
python3 -m bench.engine "$ck" --json "$out/engine-$size.json" "$@" 2>&1 | grep -v Warn
if [ "${REF:-0}" = 1 ]; then
  log "reference baseline $size"
  python3 -m bench.reference_baseline --size "$size" --tokenizer "$ck" --texts 1 --out "$out/reference-$size.json" 2>&1 | grep -v Warn | tail -6
fi
log done
