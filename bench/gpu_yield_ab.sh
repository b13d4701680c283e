#!/usr/bin/env bash
# Issue 45: the running step's one- and two-row kernels giving way to the lane (synth/persistent.py Yield) against
# the earlier tree (`git archive REV talkgate | tar -x -C .e2e/before`) on one H200 in one call: the kernels', the
# gate's and the lane's GPU tests, then each tree with `talkgate serve` default flags (1.7B CustomVoice, OpenAI HTTP
# PCM, open loop, English medium texts) at 1 req/s for 90 s and 20 req/s for 20 s (at 100 req/s the steps are past
# the lane's 64 rows and past the persistent kernels' two: nothing yields).
#   setsid bash bench/gpu_yield_ab.sh > /tmp/yield-ab.out 2>&1 < /dev/null &
BENCH=yield-ab
. "$(dirname "$0")/gpu_serve.sh"
checkpoints custom_voice
export TALKGATE_CACHE=${TALKGATE_CACHE:-/tmp/tgc-default}
GPU_TESTS=1 gpu_tests tests/gpu/test_persistent.py tests/gpu/test_stream_gate.py tests/gpu/test_engine_gpu.py \
  -k "persistent or kernel or captured or gate or lane"
grep -q " passed" "$res/gpu-tests.txt" && ! grep -q "failed\|error" "$res/gpu-tests.txt" || { log "GPU tests failed"; pack; exit 1; }
loads() {
  load 8081 "$1-rps1" --protocol openai --lang en --rps 1 --duration 90 --processes 1
  load 8081 "$1-rps20" --protocol openai --lang en --rps 20 --duration 20 --processes 2
}
UNTRACED=1 each_tree loads
grep -h "give way\|stream gate" "$res/after.log" | head -3 | tee -a "$res/progress"
log "done"; pack
