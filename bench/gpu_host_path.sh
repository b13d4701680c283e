#!/usr/bin/env bash
# Issue 45 on one H200, one call: the engine thread's host work on a new context's path (bench/host_path.py) and
# first audio end to end, the earlier tree (a `git archive REV talkgate` in .e2e/before, carried) against this one:
#   1. bench.host_path on 1.7B CustomVoice (compiled, as serve runs), each tree;
#   2. each tree in turn (the earlier first): `talkgate serve` default flags and --trace-latency, OpenAI HTTP PCM,
#      English medium texts, open loop at the rates in RATES (default "1 20 100"), each load's stage budget;
#   first, GPU_TESTS=1: tests/gpu/test_engine_gpu.py on this tree (but its fresh start) and the cloned voice's CUDA
#   test of tests/unit/test_clone_engine.py; HOST_PATH=0 leaves step 1 out.
#   git archive REV talkgate | tar -x -C .e2e/before
#   setsid bash bench/gpu_host_path.sh > /tmp/host.out 2>&1 < /dev/null &
# Results: /tmp/res-host.tgz (copy it to $OUT from a poll call); progress: $RES/progress.
BENCH=host
. "$(dirname "$0")/gpu_serve.sh"
before=$tree/.e2e/before
export TALKGATE_CACHE=/tmp/tgc-host
LOAD_TIMEOUT_S=200

gpu_tests tests/gpu/test_engine_gpu.py tests/unit/test_clone_engine.py -k "not fresh_start and (gpu or cuda or CUDA)"
checkpoints custom_voice
for which in before after; do
  [ "${HOST_PATH:-1}" = 1 ] || break
  dir=$tree; [ $which = before ] && dir=$before
  (cd "$dir" && PYTHONPATH=$dir:$tree:/tmp/site timeout 400 python3 -m bench.host_path /tmp/ck-1.7b-custom_voice \
    --compile --runs 40 --json "$res/host-$which.json" > "$res/host-$which.txt" 2>&1)
  log "host path $which: $(grep -E '^median' "$res/host-$which.txt" | cut -c1-400)"
  log "host path $which: $(grep -E '^(graph|one op)' "$res/host-$which.txt" | tr '\n' ' ')"
done
pack
loads() {
  local which=$1 rate
  for rate in ${RATES:-1 20 100}; do
    case $rate in
      1) traced "$which-rps1" --protocol openai --lang en --rps 1 --duration 40 --processes 1 ;;
      20) traced "$which-rps20" --protocol openai --lang en --rps 20 --duration 30 --processes 2 ;;
      *) traced "$which-rps$rate" --protocol openai --lang en --rps "$rate" --duration 20 --processes 4 ;;
    esac
  done
}
each_tree loads
log "done"
