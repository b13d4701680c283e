#!/usr/bin/env bash
# Issue 46 after bench/gpu_small_lane.sh, same machine (its checkpoints and its three models' compile cache reused):
# 1.7B CustomVoice + Base + VoiceDesign in one `talkgate serve` (MPS), a cloned voice, then 3 x 20 req/s for 20 s
# (OpenAI HTTP PCM, English medium texts: the default voice, the cloned voice, a designed voice), to compare with
# gpu_small_lane.sh's one-model 20 req/s in the same call series.
#   SETUP=0 setsid bash bench/gpu_three_lane.sh > /tmp/three.out 2>&1 < /dev/null &
BENCH=three-lane
. "$(dirname "$0")/gpu_serve.sh"
export TALKGATE_CACHE=/tmp/tgc-three-fresh
http() { local port=$1 dir=$2; shift 2; load "$port" "$dir" --protocol openai --lang en --processes 2 "$@"; }
start three 8081 -- --model cv=/tmp/ck-1.7b-custom_voice --model clone=/tmp/ck-1.7b-base \
  --model design=/tmp/ck-1.7b-voice_design
clone_voice 8081 speaker1
log "three models: 3 x 20 req/s for 20 s"
loaders=()
http 8081 three-cv --rps 20 --duration 20 --model cv & loaders+=($!)
http 8081 three-clone --rps 20 --duration 20 --model clone --voice speaker1 & loaders+=($!)
http 8081 three-design --rps 20 --duration 20 --model design \
  --instructions "A warm, calm female voice, middle-aged, speaking slowly and clearly." & loaders+=($!)
wait "${loaders[@]}"
curl -s http://127.0.0.1:8081/metrics | grep -E "^talkgate_engine_lane" | tee -a "$res/progress"
stop three
pack
log "done"
