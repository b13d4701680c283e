#!/usr/bin/env bash
# Issue 45's HTTP PCM figures with `talkgate serve` default flags, the earlier tree (`git archive REV talkgate | tar -x
# -C .e2e/before`) and this one in turn on one H200 in one call: 1.7B CustomVoice, open loop, English medium texts,
# 1 req/s for 60 s and 100 req/s for 20 s each (TALKGATE_CACHE: a warm compile cache if there is one).
#   setsid bash bench/gpu_default_flags_ab.sh > /tmp/default-ab.out 2>&1 < /dev/null &
BENCH=default-flags-ab
. "$(dirname "$0")/gpu_serve.sh"
checkpoints custom_voice
export TALKGATE_CACHE=${TALKGATE_CACHE:-/tmp/tgc-default}
loads() {
  load 8081 "$1-rps1" --protocol openai --lang en --rps 1 --duration 60 --processes 1
  load 8081 "$1-rps100" --protocol openai --lang en --rps 100 --duration 20 --processes 4
}
UNTRACED=1 each_tree loads
log "done"
