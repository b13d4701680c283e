#!/usr/bin/env bash
# Issue 46, a change to `serve --colocate` against the tree before it, one call on one H200: three 1.7B models
# (CustomVoice, Base, VoiceDesign) colocated, 3 x 20 req/s for 20 s (OpenAI HTTP PCM, English medium texts: the default
# voice, a cloned voice, a designed voice). This tree from an empty compile cache first (the time until ready), then
# the earlier tree (`git archive REV talkgate | tar -x -C .e2e/before`) and this one again in turn, AB_ROUNDS times
# (2), on the warm cache; then this tree with --trace-latency (its stage budget) and each model alone at 20 req/s
# (ALONE="": none), the references, and CustomVoice alone from the earlier tree (ALONE_BEFORE). GPU tests first
# (GPU_TESTS=1).
#   setsid bash bench/gpu_colocate_ab.sh > /tmp/colocate-ab.out 2>&1 < /dev/null &
BENCH=colocate-ab
. "$(dirname "$0")/gpu_serve.sh"
[ -d "$tree/.e2e/before/talkgate" ] || { log "no .e2e/before/talkgate"; exit 1; }
GPU_TESTS=${GPU_TESTS:-1} gpu_tests tests/gpu/test_engine_gpu.py -k "lane or another_models or own_share"
checkpoints custom_voice base voice_design
export TALKGATE_CACHE=/tmp/tgc-colocate
three() {   # three NAME TREE SERVE-ARGS...: the server from TREE
  local name=$1 dir=$2; shift 2
  start_in "$dir" "$name" 8081 -- --colocate \
    --model cv=/tmp/ck-1.7b-custom_voice --model clone=/tmp/ck-1.7b-base --model design=/tmp/ck-1.7b-voice_design "$@"
  mixed_load "$name"
  case $name in *-traced) kept_trace "$name" ;; esac
  stop "$name"
  pack
}
three after-fresh "$tree"
for round in $(seq "${AB_ROUNDS:-2}"); do
  three "before-$round" "$tree/.e2e/before"
  three "after-$round" "$tree"
done
: > "$res/trace.jsonl"
three after-traced "$tree" --trace-latency "$res/trace.jsonl"
alone "$tree" one ${ALONE-custom_voice base voice_design}     # each model alone at 20 req/s: its own reference
alone "$tree/.e2e/before" before-one ${ALONE_BEFORE-custom_voice}        # and from the earlier tree
log "done"
