#!/usr/bin/env bash
# Issue 45 on one H200, one call: the first-frame lane (synth/lane.py). The GPU tests of the engine first (the lane's
# graphs, its audio against the same contexts without it), then the earlier tree (a `git archive REV talkgate` in
# .e2e/before, carried: no lane) and this one, each from its start, `talkgate serve` default flags and
# --trace-latency, 1.7B CustomVoice random weights, OpenAI HTTP PCM, English medium texts, open loop: 1 req/s for
# 30 s, 20 and 100 req/s for 20 s (traced: each load's stage budget), then a sweep of LEVELS req/s, 10 s a level
# (clean = 0 underruns and p95 first audio <= 100 ms), and the engine's lane launches.
#   git archive REV talkgate | tar -x -C .e2e/before
#   setsid bash bench/gpu_lane.sh > /tmp/lane.out 2>&1 < /dev/null &
# Results: /tmp/res-lane.tgz (copy it to $OUT from a poll call); progress: $RES/progress.
BENCH=lane
. "$(dirname "$0")/gpu_serve.sh"
export TALKGATE_CACHE=/tmp/tgc-lane
LOAD_TIMEOUT_S=300

GPU_TESTS=${GPU_TESTS:-1} gpu_tests tests/gpu/test_engine_gpu.py -k "lane or staged or opening or graphs_equal"
checkpoints custom_voice
loads() {
  traced "$1-rps1" --protocol openai --lang en --rps 1 --duration 30 --processes 1
  traced "$1-rps20" --protocol openai --lang en --rps 20 --duration 20 --processes 2
  traced "$1-rps100" --protocol openai --lang en --rps 100 --duration 20 --processes 3
  load 8081 "$1-sweep" --protocol openai --lang en --sweep "${LEVELS:-190,210}" --duration 10 --ttfa-limit-ms 100 \
    --processes 4 --max-in-flight 4096
  curl -s "http://127.0.0.1:8081/metrics" | grep -E "^talkgate_engine_(lane|prompt)" | tee -a "$res/progress"
}
each_tree loads
log "done"
