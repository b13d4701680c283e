#!/usr/bin/env bash
# Issues 45 and 46 on one H200, one call series:
#   GPU tests: tests/gpu/test_engine_gpu.py's lane tests (the lane beside a one-row step of the persistent kernels,
#     streamed text on the lane, the lane's one-row buffers);
#   the lane beside one- and two-row steps (the persistent kernels): .e2e/before (the tree before it) and then this
#     one, each from its start, 1.7B CustomVoice, default flags, --trace-latency: OpenAI HTTP PCM at 1 req/s for 80 s
#     20 and 100 req/s for 20 s each (English medium texts), each traced; the engine's lane launches; on this tree then
#     streamed text per language, one context at a time (bench/streamed_first_audio.py: Chinese and Japanese
#     without punctuation against English, first audio from the first delta);
#   three 1.7B models (CustomVoice, Base, VoiceDesign) from an empty compile cache: the time until ready (90 s
#     target) and the warm-up's compile lines.
#   git archive REV talkgate | tar -x -C .e2e/before
#   setsid bash bench/gpu_small_lane.sh > /tmp/small.out 2>&1 < /dev/null &
# Results: /tmp/res-small-lane.tgz (copy it to $OUT from a poll call); progress: $RES/progress.
BENCH=small-lane
. "$(dirname "$0")/gpu_serve.sh"
export TALKGATE_CACHE=/tmp/tgc-small-lane
LOAD_TIMEOUT_S=200
GPU_TESTS=1 gpu_tests tests/gpu/test_engine_gpu.py -k lane
checkpoints custom_voice base voice_design
lanes() { curl -s "http://127.0.0.1:8081/metrics" | grep -E "^talkgate_engine_lane" | sed "s/^/$1 /" \
  | tee -a "$res/progress"; }
loads() {
  traced "$1-http-rps1" --protocol openai --lang en --rps 1 --duration 80 --processes 1
  traced "$1-http-rps20" --protocol openai --lang en --rps 20 --duration 20 --processes 2
  traced "$1-http-rps100" --protocol openai --lang en --rps 100 --duration 20 --processes 4
  lanes "$1"
  if [ "$1" = after ]; then
    timeout 200 python3 -m bench.streamed_first_audio --url ws://127.0.0.1:8081 --runs 3 > "$res/streamed.txt" 2>&1
    tail -12 "$res/streamed.txt" | tee -a "$res/progress"
  fi
}
each_tree loads
export TALKGATE_CACHE=/tmp/tgc-three-fresh
three="--model cv=/tmp/ck-1.7b-custom_voice --model clone=/tmp/ck-1.7b-base --model design=/tmp/ck-1.7b-voice_design"
start three 8081 -- $three
grep -E "MPS|compile helpers|helper processes compile|ready \(|warm-up|compiled|talker@|codes@|lane " \
  "$res/three.log" | cut -c12-260 | tee -a "$res/progress"
stop three
pack
log "done"
