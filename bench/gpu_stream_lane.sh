#!/usr/bin/env bash
# Issue 45 on one H200, one call: streamed text on the first-frame lane. A context opened before its text (native
# WebSocket, an LLM's deltas) used to wait for the step boundary when its committing delta came during a step; it
# takes the lane now. 5eceba0's talkgate (.e2e/before) and this tree, each from its start, `talkgate serve` default
# flags and --trace-latency, 1.7B CustomVoice random weights: native WebSocket PCM, English medium texts streamed at
# 25 tokens a second, 20 req/s for 15 s (traced: first audio from the committing delta, `total`), then the engine's
# lane launches.
#   git archive REV talkgate | tar -x -C .e2e/before
#   setsid bash bench/gpu_stream_lane.sh > /tmp/stream.out 2>&1 < /dev/null &
# Results: /tmp/res-stream-lane.tgz (copy it to $OUT from a poll call); progress: $RES/progress.
BENCH=stream-lane
. "$(dirname "$0")/gpu_serve.sh"
export TALKGATE_CACHE=/tmp/tgc-stream-lane
LOAD_TIMEOUT_S=120
checkpoints custom_voice
loads() {
  traced "$1-stream-en" --protocol native --tokens-per-second 25 --lang en --rps 20 --duration 15 --processes 2
  curl -s "http://127.0.0.1:8081/metrics" | grep -E "^talkgate_engine_lane" | sed "s/^/$1 /" | tee -a "$res/progress"
}
each_tree loads
log "done"
