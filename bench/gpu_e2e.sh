#!/usr/bin/env bash
# The issue-7 end-to-end benchmark on a GPU machine, one model per call (each fits a 10-minute call):
#   bench/gpu_e2e.sh 1.7b   HTTP PCM, texts up front: 1 and 20 req/s, then a sweep; reference baseline
#   bench/gpu_e2e.sh 0.6b   256 concurrent native Opus streams (10% cancelled); reference baseline
# REF=0 skips the reference baseline (it does not change between runs of talkgate).
# Setup: bench/gpu_env.sh. Results: $OUT/e2e-<size>.tgz
set -uo pipefail
size=${1:?1.7b or 0.6b}
out=${OUT:-/tmp/out}; res=/tmp/res-$size; mkdir -p "$out" "$res"
. bench/gpu_env.sh
tg() { python3 -m talkgate "$@"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$res/gpu.txt"
python3 -c "import torch, aiohttp; print('torch', torch.__version__, 'aiohttp', aiohttp.__version__)" | tee -a "$res/gpu.txt"

gpu_tests
ck=/tmp/ck-$size
log "checkpoint $size"; tg checkpoint create "$ck" --preset "$size" --variant custom_voice | tail -1
log "serve"
tg serve --model "$ck" --device cuda --port 8080 > "$res/server.log" 2>&1 &
srv=$!
for _ in $(seq 600); do grep -q "talkgate: ready" "$res/server.log" && break; sleep 0.5; done
grep "ready\|Error\|error" "$res/server.log" | head -5
load() { python3 -m talkgate bench --url http://127.0.0.1:8080 --warmup 4 "$@" 2>&1 | tail -25; }
if [ "$size" = 1.7b ]; then
  log "openai 1 rps";  load --protocol openai --rps 1 --duration 30 --lang en --out "$res/rps1"
  log "openai 20 rps"; load --protocol openai --rps 20 --duration 15 --out "$res/rps20"
  log "openai sweep";  load --protocol openai --sweep 30,40,60,80,100 --duration 8 --out "$res/sweep"
else
  log "native opus, 256 streams"
  load --protocol native --encoding opus --concurrency 256 --duration 30 --cancel-share 0.1 --bucket medium --out "$res/c256"
  log "native pcm 1 rps, cancels"; load --protocol native --rps 2 --duration 20 --cancel-share 0.5 --out "$res/cancel"
fi
kill -TERM $srv; wait $srv
[ "${REF:-1}" = 0 ] || { log "reference baseline $size"; python3 -m bench.reference_baseline --size "$size" --tokenizer "$ck" --texts 1 --out "$res/reference.json" 2>&1 | grep -v Warn | tail -4; }
tar czf "$out/e2e-$size.tgz" -C /tmp "res-$size"
log "done"
