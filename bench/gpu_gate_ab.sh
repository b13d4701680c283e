#!/usr/bin/env bash
# Issue 45: the stream gate (synth/stream_gate.py: a running step's parts wait while a lane launch runs) against the
# earlier tree (`git archive REV talkgate | tar -x -C .e2e/before`) on one H200 in one call: the gate's and the
# lane's GPU tests, then each tree with `talkgate serve` default flags (1.7B CustomVoice, OpenAI HTTP PCM, open
# loop, English medium texts) at 1 req/s for 90 s, 20 and 100 req/s for 20 s.
#   setsid bash bench/gpu_gate_ab.sh > /tmp/gate-ab.out 2>&1 < /dev/null &
BENCH=gate-ab
. "$(dirname "$0")/gpu_serve.sh"
checkpoints custom_voice
export TALKGATE_CACHE=${TALKGATE_CACHE:-/tmp/tgc-default}
GPU_TESTS=1 gpu_tests tests/gpu/test_stream_gate.py tests/gpu/test_engine_gpu.py -k "gate or lane"
grep -q " passed" "$res/gpu-tests.txt" && ! grep -q "failed\|error" "$res/gpu-tests.txt" || { log "GPU tests failed"; pack; exit 1; }
loads() {
  load 8081 "$1-rps1" --protocol openai --lang en --rps 1 --duration 90 --processes 1
  load 8081 "$1-rps20" --protocol openai --lang en --rps 20 --duration 20 --processes 2
  load 8081 "$1-rps100" --protocol openai --lang en --rps 100 --duration 20 --processes 4
}
UNTRACED=1 each_tree loads
log "done"; pack
