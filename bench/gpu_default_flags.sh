#!/usr/bin/env bash
# Issue 45's HTTP PCM figures with `talkgate serve` default flags (no --trace-latency: a traced server writes a JSON
# line a request and stamps every stage), one H200, 1.7B CustomVoice from an empty compile cache, open loop, English
# medium texts: 1 req/s for 60 s, 100 req/s for 20 s, 20 req/s for 20 s; the results packed after each.
#   setsid bash bench/gpu_default_flags.sh > /tmp/default.out 2>&1 < /dev/null &
BENCH=default-flags
. "$(dirname "$0")/gpu_serve.sh"
checkpoints custom_voice
export TALKGATE_CACHE=/tmp/tgc-default
start one 8081 -- --model /tmp/ck-1.7b-custom_voice
http() { load 8081 "$1" --protocol openai --lang en "${@:2}"; pack; }
http rps1 --rps 1 --duration 60 --processes 1
http rps100 --rps 100 --duration 20 --processes 4
http rps20 --rps 20 --duration 20 --processes 2
curl -s http://127.0.0.1:8081/metrics | grep -E "^talkgate_engine_(step|loop|lane)" > "$res/metrics.txt"
stop one
pack
log "done"
