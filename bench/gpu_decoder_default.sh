#!/usr/bin/env bash
# Issue 44 on one H200, one call: the codec decoder's precision chosen at load (float16 where the probe of the
# checkpoint's decoder allows, synth/decoder_precision.py) against the earlier default, float32 (a `git archive REV
# talkgate` in .e2e/before, carried). First, GPU_TESTS=1: the probe's CUDA test and the engine GPU tests that load a
# bfloat16 and a float32 model. Then each tree in turn (the earlier first; `talkgate serve` default flags and
# --trace-latency, 1.7B CustomVoice random weights, OpenAI HTTP PCM, English medium texts, open loop):
#   1 req/s for 40 s and 20 req/s for 30 s (traced: each load's stage budget), then a sweep of LEVELS req/s, 10 s a
#   level, clean = 0 underruns and p95 first audio <= 100 ms.
#   git archive REV talkgate | tar -x -C .e2e/before
#   setsid bash bench/gpu_decoder_default.sh > /tmp/dec.out 2>&1 < /dev/null &
# Results: /tmp/res-decoder.tgz (copy it to $OUT from a poll call); progress: $RES/progress.
BENCH=decoder
. "$(dirname "$0")/gpu_serve.sh"
export TALKGATE_CACHE=/tmp/tgc-decoder
LOAD_TIMEOUT_S=300

gpu_tests tests/unit/test_decoder_precision.py tests/gpu/test_engine_gpu.py \
  -k "precision or bf16_graphs or graphs_equal_eager"
checkpoints custom_voice
loads() {
  local which=$1
  grep -h "codec decoder:" "$res/$which.log" | tail -1 | tee -a "$res/progress"
  traced "$which-rps1" --protocol openai --lang en --rps 1 --duration 40 --processes 1
  traced "$which-rps20" --protocol openai --lang en --rps 20 --duration 30 --processes 2
  load 8081 "$which-sweep" --protocol openai --lang en --sweep "${LEVELS:-140,155,170,185,200,215}" --duration 10 \
    --ttfa-limit-ms 100 --processes 4 --max-in-flight 4096
}
each_tree loads
log "done"
