#!/usr/bin/env bash
# Issues 45 and 46 on one H200, one call series (run detached, as gpu_multi.sh):
#   one 1.7B CustomVoice server, default flags, --trace-latency (issue 45's budget per stage, bench.latency_trace):
#     OpenAI HTTP PCM at 1, 20 and 100 req/s; native WebSocket Opus 48 kHz (whole text) at 1 and 20 req/s; native
#     PCM streamed text (25 Qwen tokens/s, as an LLM) in English and in Chinese (no punctuation in the deltas' way)
#     at 20 req/s: first audio from the committing delta is the trace's read -> written;
#   then 1.7B CustomVoice + Base + VoiceDesign in one serve (issue 46), 192 slots each: a cloned voice alone at 1 and
#     20 req/s (the other engines idle: the clone's own budget), then the mixed load, 3 x 20 req/s, to compare
#     with the one-model server's 20 req/s above, same call.
# PART=opus-share: only the native loads on one model, then the three models with no --max-contexts (each engine
# process sized from its third of the GPU's memory, serve's rule for engine processes that share a GPU).
# Results: $OUT/latency.tgz; progress: $RES/progress.
#   setsid bash bench/gpu_latency.sh > /tmp/latency.out 2>&1 < /dev/null &
BENCH=latency
. "$(dirname "$0")/gpu_serve.sh"
export TALKGATE_CACHE=/tmp/tgc
LOAD_TIMEOUT_S=200
checkpoints custom_voice base voice_design

part=${PART:-all}      # opus-share: the native Opus and Chinese loads, then three models sized by the memory share
start one 8081 -- --model /tmp/ck-1.7b-custom_voice --trace-latency "$res/trace.jsonl"
if [ "$part" = all ]; then
traced http-rps1 --protocol openai --lang en --rps 1 --duration 40 --processes 1
traced http-rps20 --protocol openai --lang en --rps 20 --duration 30 --processes 2
traced http-rps100 --protocol openai --lang en --rps 100 --duration 20 --processes 4
fi
traced opus-rps1 --protocol native --encoding opus --tokens-per-second 0 --lang en --rps 1 --duration 40 --processes 1
traced opus-rps20 --protocol native --encoding opus --tokens-per-second 0 --lang en --rps 20 --duration 30 --processes 2
[ "$part" = all ] && traced stream-en-rps20 --protocol native --tokens-per-second 25 --lang en --rps 20 --duration 30 --processes 2
traced stream-zh-rps20 --protocol native --tokens-per-second 25 --lang zh --rps 20 --duration 30 --processes 2
curl -s http://127.0.0.1:8081/metrics > "$res/one-metrics.txt"
stop one

if [ "$part" = opus-share ]; then     # three engine processes on one GPU, no --max-contexts: a third of it each
  start three 8081 -- --model cv=/tmp/ck-1.7b-custom_voice --model clone=/tmp/ck-1.7b-base \
    --model design=/tmp/ck-1.7b-voice_design
  for p in $(pgrep -f talkgate.processes.engine_process); do tr '\0' ' ' < /proc/$p/cmdline | grep -o -- "--model [^ ]*\|--memory-share [^ ]*" | tr '\n' ' '; echo; done | tee -a "$res/progress"
  grep -h "slots: \|slots\b.*share" "$res/three.log" | cut -c1-220 | tee -a "$res/progress"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv | tee -a "$res/progress"
  load 8081 three-share-cv --protocol openai --lang en --rps 20 --duration 20 --processes 2 --model cv
  curl -s http://127.0.0.1:8081/metrics | grep -E "^talkgate_engine_slots(_free)?\b" | tee -a "$res/progress"
  stop three
  tar czf "$out/latency.tgz" -C "$(dirname "$res")" "$(basename "$res")"
  log "done"; exit 0
fi

start three 8081 -- --model cv=/tmp/ck-1.7b-custom_voice --model clone=/tmp/ck-1.7b-base \
  --model design=/tmp/ck-1.7b-voice_design --max-contexts 192 --trace-latency "$res/trace.jsonl"
clone_voice 8081 speaker1
traced clone-rps1 --protocol openai --lang en --model clone --voice speaker1 --rps 1 --duration 30 --processes 1
traced clone-rps20 --protocol openai --lang en --model clone --voice speaker1 --rps 20 --duration 30 --processes 2
log "three models: 3 x 20 req/s for 30 s"
: > "$res/trace.jsonl"
loaders=()
load 8081 three-cv --protocol openai --lang en --rps 20 --duration 30 --processes 2 --model cv & loaders+=($!)
load 8081 three-clone --protocol openai --lang en --rps 20 --duration 30 --processes 2 --model clone --voice speaker1 \
  & loaders+=($!)
load 8081 three-design --protocol openai --lang en --rps 20 --duration 30 --processes 2 --model design \
  --instructions "A warm, calm female voice, middle-aged, speaking slowly and clearly." & loaders+=($!)
wait "${loaders[@]}"            # the loaders only: a bare wait would wait for the server too
cp "$res/trace.jsonl" "$res/trace-three.jsonl"
python3 -m bench.latency_trace "$res/trace-three.jsonl" > "$res/budget-three.txt" 2>&1
curl -s http://127.0.0.1:8081/metrics > "$res/three-metrics.txt"
stop three
tar czf "$out/latency.tgz" -C "$(dirname "$res")" "$(basename "$res")"
log "done"
