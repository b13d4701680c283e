#!/usr/bin/env bash
# Issue 45: at 1 req/s each of the default 14 gateway workers (16 cores) sees a request about every 14 s, its
# caches cold; is first audio's idle path faster with one worker? This tree served with `--workers 1`, then with the
# default, 1.7B CustomVoice, OpenAI HTTP PCM, English medium texts, open loop, 1 req/s for 90 s, each traced
# (--trace-latency: the worker's stages against the engine's).
#   setsid bash bench/gpu_workers_low_load.sh > /tmp/workers.out 2>&1 < /dev/null &
BENCH=workers-low-load
. "$(dirname "$0")/gpu_serve.sh"
checkpoints custom_voice
export TALKGATE_CACHE=${TALKGATE_CACHE:-/tmp/tgc-default}
for workers in 1 default; do
  args=(--model /tmp/ck-1.7b-custom_voice --trace-latency "$res/trace.jsonl")
  [ $workers = default ] || args+=(--workers "$workers")
  start "w$workers" 8081 -- "${args[@]}"
  traced "w$workers-rps1" --protocol openai --lang en --rps 1 --duration 90 --processes 1
  stop "w$workers"
  pack
done
log "done"; pack
