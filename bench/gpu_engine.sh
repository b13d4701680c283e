#!/usr/bin/env bash
# bench/engine.py on a GPU machine (issue 3), one model per call (fits a 10-minute call):
#   bench/gpu_engine.sh 0.6b [extra bench/engine.py args]
# GPU_TESTS=1 first runs the GPU-only tests; REF=1 then runs the official reference at the same size.
# Needs the same wheels as bench/gpu_e2e.sh (.e2e/, .whl/). Results: $OUT/engine-<size>.json
set -uo pipefail
size=${1:?0.6b or 1.7b}; shift
out=${OUT:-/tmp/out}; mkdir -p "$out"
log() { echo "[$(date +%T)] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .e2e/*.whl .whl/*.whl || exit 1
cp .e2e/libopus.so.0 /usr/lib/x86_64-linux-gnu/ && ldconfig
mkdir -p /tmp/p && ln -sfn "$PWD" /tmp/p/talkgate
export PYTHONPATH=/tmp/site:/tmp/p PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "${GPU_TESTS:-0}" = 1 ]; then
  log "GPU tests"
  timeout 240 python3 -m pytest -q -p no:cacheprovider -x tests/test_sample_kernel.py tests/test_attention.py \
    tests/test_engine_gpu.py 2>&1 | tail -15
fi
ck=/tmp/ck-$size
log "checkpoint $size"; python3 -m talkgate.gateway.cli checkpoint create "$ck" --preset "$size" --variant custom_voice | tail -1
log "bench/engine.py $*"
python3 -m talkgate.bench.engine "$ck" --json "$out/engine-$size.json" "$@" 2>&1 | grep -v Warn
if [ "${REF:-0}" = 1 ]; then
  log "reference baseline $size"
  python3 bench/reference_baseline.py --size "$size" --tokenizer "$ck" --texts 1 --out "$out/reference-$size.json" 2>&1 | grep -v Warn | tail -6
fi
log done
