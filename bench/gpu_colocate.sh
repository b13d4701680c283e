#!/usr/bin/env bash
# Issue 46 on one H200, one call: three 1.7B models (CustomVoice, Base, VoiceDesign) in one `talkgate serve
# --colocate` (one engine process: every model's first-frame lane above every model's steps), from an empty compile
# cache (the time until ready: 90 s target), 3 x 20 req/s for 20 s (OpenAI HTTP PCM, English medium texts: the
# default voice, a cloned voice, a designed voice); then the references: the same three as separate processes under
# MPS (default flags, the cache warm; SEPARATE=0 leaves them out) and each model alone at 20 req/s (ALONE="": none).
# TRACE=1: the colocated load again with --trace-latency, its stage budget. GPU tests first (GPU_TESTS=1; GPU_TESTS_K
# their -k): a model's lane beside another's step in one thread, an engine's slots from its own share, the lanes.
#   setsid bash bench/gpu_colocate.sh > /tmp/colocate.out 2>&1 < /dev/null &
BENCH=colocate
. "$(dirname "$0")/gpu_serve.sh"
GPU_TESTS=${GPU_TESTS:-1} gpu_tests tests/gpu/test_engine_gpu.py -k "${GPU_TESTS_K:-lane or another_models or own_share}"
checkpoints custom_voice base voice_design
export TALKGATE_CACHE=/tmp/tgc-colocate
three() {   # three NAME SERVE-ARGS...
  local name=$1; shift
  start "$name" 8081 -- --model cv=/tmp/ck-1.7b-custom_voice --model clone=/tmp/ck-1.7b-base \
    --model design=/tmp/ck-1.7b-voice_design "$@"
  mixed_load "$name"
  case $name in *-traced) kept_trace "$name" ;; esac
  stop "$name"
  pack
}
three colocated --colocate
if [ "${TRACE:-0}" = 1 ]; then       # the stage budget of the colocated models' first audio (all three in one)
  : > "$res/trace.jsonl"
  three colocated-traced --colocate --trace-latency "$res/trace.jsonl"
fi
[ "${SEPARATE:-1}" = 1 ] && three separate
alone "$tree" one ${ALONE-custom_voice base voice_design}     # each model alone at 20 req/s: its own reference
log "done"
