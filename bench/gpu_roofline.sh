#!/usr/bin/env bash
# bench/roofline.py on a GPU machine (issue 44): the step's roofline per part, 1.7B then 0.6B, in one call of about
# 5 minutes (each size: a fresh compile of about a minute, warm-up at 1,024 rows, 20 replays a part):
#   bash bench/gpu_roofline.sh [results folder, default $OUT or /tmp/out] [extra bench/roofline.py args]
# Setup: bench/gpu_env.sh. Results: <folder>/roofline-<size>.json and .md (the printed tables).
set -uo pipefail
out=${1:-${OUT:-/tmp/out}}; shift $(( $# > 0 ? 1 : 0 ))
mkdir -p "$out"
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for size in 1.7b 0.6b; do
  ck=/tmp/ck-$size
  [ -d "$ck" ] || { log "checkpoint $size"; python3 -m talkgate checkpoint create "$ck" --preset "$size" --variant custom_voice | tail -1; }
  log "bench/roofline.py $size $*"
  # a size that hangs must leave the other its time
  timeout 280 python3 -m bench.roofline "$ck" --label "$size" --reps 20 --json "$out/roofline-$size.json" "$@" 2>&1 \
    | grep -v Warn | tee "$out/roofline-$size.md"
done
log done
