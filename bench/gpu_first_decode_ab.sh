#!/usr/bin/env bash
# Issue 45: first frames decoded ahead of the running rows' past the lane's 64 rows (Runner.launch decode_first,
# synth/engine.py FIRST_DECODE_MAX_ROWS) against the earlier tree (`git archive REV talkgate | tar -x -C
# .e2e/before`) on one H200 in one call: the engine's GPU tests of it and of the lane, then each tree with `talkgate
# serve` default flags (1.7B CustomVoice, OpenAI HTTP PCM, open loop, English medium texts) at 100 and 135 req/s (about
# 80 and 100-128 running rows: where it applies) and 20 req/s (where it does not: the lane's), 20 s each.
#   setsid bash bench/gpu_first_decode_ab.sh > /tmp/first-decode-ab.out 2>&1 < /dev/null &
BENCH=first-decode-ab
. "$(dirname "$0")/gpu_serve.sh"
checkpoints custom_voice
export TALKGATE_CACHE=${TALKGATE_CACHE:-/tmp/tgc-default}
GPU_TESTS=1 gpu_tests tests/gpu/test_persistent.py tests/gpu/test_stream_gate.py tests/gpu/test_engine_gpu.py \
  -k "first_frames_decoded or lane or graphs_equal or persistent or kernel or captured or gate"
grep -q " passed" "$res/gpu-tests.txt" && ! grep -q "failed\|error" "$res/gpu-tests.txt" || { log "GPU tests failed"; pack; exit 1; }
loads() {
  load 8081 "$1-rps100" --protocol openai --lang en --rps 100 --duration 20 --processes 4
  load 8081 "$1-rps135" --protocol openai --lang en --rps 135 --duration 20 --processes 4
  load 8081 "$1-rps20" --protocol openai --lang en --rps 20 --duration 20 --processes 2
}
UNTRACED=1 each_tree loads
log "done"; pack
