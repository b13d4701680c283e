#!/usr/bin/env bash
# Issues 46 and 45 on one H200, one call series: the first-frame lane (synth/lane.py) in engine processes that share
# a GPU under CUDA MPS, and the lane's figures for the native WebSocket (Opus) and a cloned voice.
#   Three 1.7B models (CustomVoice, Base, VoiceDesign) in one `talkgate serve` (default flags: MPS, each engine
#   process sized from its third of the GPU, --trace-latency), the earlier tree (.e2e/before: no lane where the GPU
#   is shared) and then this one, each from its start: a voice cloned, the mixed open-loop load, 3 x 20 req/s for
#   30 s (OpenAI HTTP PCM, English medium texts), its stage budget and the engines' lane launches; on this tree
#   then the cloned voice alone (the other models idle) at 1 req/s for 30 s and 20 req/s for 20 s.
#   Then one model (1.7B CustomVoice, default flags, this tree): OpenAI HTTP PCM at 20 req/s (the figure the mixed
#   load is held to) and native WebSocket Opus 48 kHz (whole text) at 20 req/s, HTTP PCM at 1 req/s for 60 s and
#   Opus at 1 req/s for 40 s, each traced.
#   git archive REV talkgate | tar -x -C .e2e/before
#   setsid bash bench/gpu_shared_lane.sh > /tmp/sl.out 2>&1 < /dev/null &
# Results: /tmp/res-shared-lane.tgz (copy it to $OUT from a poll call); progress: $RES/progress.
BENCH=shared-lane
. "$(dirname "$0")/gpu_serve.sh"
export TALKGATE_CACHE=/tmp/tgc-shared-lane
LOAD_TIMEOUT_S=200
checkpoints custom_voice base voice_design
DESIGN="A warm, calm female voice, middle-aged, speaking slowly and clearly."
three="--model cv=/tmp/ck-1.7b-custom_voice --model clone=/tmp/ck-1.7b-base --model design=/tmp/ck-1.7b-voice_design"
http() { local port=$1 dir=$2; shift 2; load "$port" "$dir" --protocol openai --lang en --processes 2 "$@"; }
lanes() { curl -s "http://127.0.0.1:8081/metrics" | grep -E "^talkgate_engine_(lane|step_seconds_(sum|count))" \
  | tee "$res/$1-metrics.txt" | grep lane | tee -a "$res/progress"; }

for which in before after; do
  dir=$tree; [ $which = before ] && dir=$tree/.e2e/before
  (cd "$dir" && export PYTHONPATH=$dir:/tmp/site && start "three-$which" 8081 -- $three \
    --trace-latency "$res/trace.jsonl")
  grep -E "MPS|ready \(" "$res/three-$which.log" | cut -c12-200 | tee -a "$res/progress"
  clone_voice 8081 speaker1
  : > "$res/trace.jsonl"
  loaders=()
  http 8081 "$which-cv" --rps 20 --duration 30 --model cv & loaders+=($!)
  http 8081 "$which-clone" --rps 20 --duration 30 --model clone --voice speaker1 & loaders+=($!)
  http 8081 "$which-design" --rps 20 --duration 30 --model design --instructions "$DESIGN" & loaders+=($!)
  wait "${loaders[@]}"
  kept_trace "$which-mixed"
  lanes "$which-mixed"
  if [ $which = after ]; then
    traced clone-rps1 --protocol openai --lang en --model clone --voice speaker1 --rps 1 --duration 30 --processes 1
    traced clone-rps20 --protocol openai --lang en --model clone --voice speaker1 --rps 20 --duration 20 --processes 2
    lanes clone
  fi
  kill -TERM "$(cat "$res/three-$which.pid")"; gone "$(cat "$res/three-$which.pid")"
  pack
done

start one 8081 -- --model /tmp/ck-1.7b-custom_voice --trace-latency "$res/trace.jsonl"
traced http-rps20 --protocol openai --lang en --rps 20 --duration 20 --processes 2
traced opus-rps20 --protocol native --encoding opus --tokens-per-second 0 --lang en --rps 20 --duration 20 --processes 2
traced http-rps1 --protocol openai --lang en --rps 1 --duration 60 --processes 1
traced opus-rps1 --protocol native --encoding opus --tokens-per-second 0 --lang en --rps 1 --duration 40 --processes 1
lanes one
stop one
pack
log "done"
