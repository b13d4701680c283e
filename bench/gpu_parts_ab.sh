#!/usr/bin/env bash
# Issue 45: the persistent kernels launched in parts (synth/persistent.py TALKER_PARTS, PREDICTOR_PARTS) against the
# earlier tree (`git archive REV talkgate | tar -x -C .e2e/before`) on one H200 in one call: first the kernels' GPU
# tests, then each tree with `talkgate serve` default flags (1.7B CustomVoice, OpenAI HTTP PCM, open loop, English
# medium texts) at 1 req/s for 90 s, 20 and 100 req/s for 20 s; then, with ROWS set, this tree with first frames
# apart beside up to ROWS running rows (FIRST_APART_MAX_ROWS, a patched copy) at 20 and 100 req/s; the engine tests.
#   setsid bash bench/gpu_parts_ab.sh > /tmp/parts-ab.out 2>&1 < /dev/null &
BENCH=parts-ab
. "$(dirname "$0")/gpu_serve.sh"
checkpoints custom_voice
export TALKGATE_CACHE=${TALKGATE_CACHE:-/tmp/tgc-default}
GPU_TESTS=1 gpu_tests tests/gpu/test_persistent.py
grep -q " passed" "$res/gpu-tests.txt" && ! grep -q "failed\|error" "$res/gpu-tests.txt" || { log "kernel tests failed"; pack; exit 1; }
mv "$res/gpu-tests.txt" "$res/gpu-tests-persistent.txt"
loads() {
  load 8081 "$1-rps1" --protocol openai --lang en --rps 1 --duration 90 --processes 1
  load 8081 "$1-rps20" --protocol openai --lang en --rps 20 --duration 20 --processes 2
  load 8081 "$1-rps100" --protocol openai --lang en --rps 100 --duration 20 --processes 4
}
UNTRACED=1 each_tree loads
if [ -n "${ROWS:-}" ]; then
  rows=/tmp/rows$ROWS; rm -rf "$rows"; mkdir -p "$rows"; cp -r "$tree/talkgate" "$rows/"
  sed -i "s/^FIRST_APART_MAX_ROWS = 64$/FIRST_APART_MAX_ROWS = $ROWS/" "$rows/talkgate/synth/engine.py"
  grep -q "^FIRST_APART_MAX_ROWS = $ROWS$" "$rows/talkgate/synth/engine.py" && {
    start_in "$rows" "rows$ROWS" 8081 -- --model /tmp/ck-1.7b-custom_voice
    load 8081 "rows$ROWS-rps100" --protocol openai --lang en --rps 100 --duration 20 --processes 4
    load 8081 "rows$ROWS-rps20" --protocol openai --lang en --rps 20 --duration 20 --processes 2
    stop "rows$ROWS"; pack; }
fi
GPU_TESTS=1 gpu_tests tests/gpu/test_engine_gpu.py
log "done"; pack
