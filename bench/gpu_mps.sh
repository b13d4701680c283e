#!/usr/bin/env bash
# Issue 46 on one H200: three 1.7B models (CustomVoice, Base, VoiceDesign) in one `talkgate serve`, default flags
# (each engine process sized from its third of the GPU), with CUDA MPS (--mps auto, the default: a daemon of
# talkgate's own) against without (--mps off), and a one-model server (1.7B CustomVoice, default flags), one call
# series:
#   GPU test tests/gpu/test_mps.py;
#   three models, MPS, from an empty compile cache (the time until ready from a fresh start); a voice cloned; the
#     mixed open-loop load, 3 x 20 req/s for 30 s (OpenAI HTTP PCM, English medium texts); then cv and clone at
#     20 req/s each while the VoiceDesign engine process is SIGKILLed 10 s in (the others' streams must stay clean);
#     then the supervisor SIGKILLed: what is left of the MPS daemon;
#   three models, --mps off (warm cache), the same mixed load;
#   one model, 20 req/s for 30 s: the figure the mixed load's p95 is held to (within 5 ms).
# PART=fresh: the GPU test, the three models with MPS from an empty cache and the mixed load, a normal stop (what is
# left of the daemon), then the one-model server at 20 and at 60 req/s (the same work as the mixed load in one
# engine: the floor that sharing one GPU's steps could reach); then tests/gpu/test_engine_gpu.py's fresh start.
# PART=start: the three models' fresh start alone (the time until ready), then 3 x 20 req/s for 15 s.
# Results: /tmp/res-mps.tgz, copied to $OUT by the last poll call; progress: $RES/progress.
#   setsid bash bench/gpu_mps.sh > /tmp/mps.out 2>&1 < /dev/null &
BENCH=mps
. "$(dirname "$0")/gpu_serve.sh"
export TALKGATE_CACHE=/tmp/tgc-mps
LOAD_TIMEOUT_S=200
checkpoints custom_voice base voice_design
http() {    # http PORT DIR ARGS...: an OpenAI HTTP PCM load
  local port=$1 dir=$2; shift 2
  load "$port" "$dir" --protocol openai --lang en --processes 2 "$@"
}
DESIGN="A warm, calm female voice, middle-aged, speaking slowly and clearly."
mixed() {   # mixed PREFIX VOICE: 3 x 20 req/s for 30 s (LOAD_DURATION), a third on each model
  local loaders=() d=${LOAD_DURATION:-30}
  http 8081 "$1-cv" --rps 20 --duration "$d" --model cv & loaders+=($!)
  http 8081 "$1-clone" --rps 20 --duration "$d" --model clone --voice "$2" & loaders+=($!)
  http 8081 "$1-design" --rps 20 --duration "$d" --model design --instructions "$DESIGN" & loaders+=($!)
  wait "${loaders[@]}"
}
mps_left() { pgrep -u "$(id -u)" -l nvidia-cuda-mps | tee -a "$res/progress"; }   # by name: not our shells
pack() { tar czf "$res.tgz" -C "$(dirname "$res")" "$(basename "$res")"; log "done"; }

log "GPU test"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mps.py 2>&1 | tail -8 | tee -a "$res/progress"
mps_left

three="--model cv=/tmp/ck-1.7b-custom_voice --model clone=/tmp/ck-1.7b-base --model design=/tmp/ck-1.7b-voice_design"
if [ "${PART:-all}" = start ]; then       # the fresh start only, then a short mixed load
  start three-mps 8081 -- $three
  grep -E "MPS|compile helpers|helper processes compile|ready \(|loaded:|slots: |warm-up captures" \
    "$res/three-mps.log" | cut -c12-260 | tee -a "$res/progress"
  clone_voice 8081 speaker1
  LOAD_DURATION=15 mixed mps speaker1
  stop three-mps
  pack
  exit 0
fi
if [ "${PART:-all}" = fresh ]; then
  start three-mps 8081 -- $three
  grep -E "MPS|compile helpers|ready \(|loaded:" "$res/three-mps.log" | cut -c12-200 | tee -a "$res/progress"
  clone_voice 8081 speaker1
  log "MPS: 3 x 20 req/s"
  mixed mps speaker1
  curl -s http://127.0.0.1:8081/metrics > "$res/mps-metrics.txt"
  stop three-mps
  log "stopped; MPS processes left:"; mps_left
  start one 8081 -- --model /tmp/ck-1.7b-custom_voice
  log "one model: 20 req/s, then 60 req/s"
  http 8081 one-rps20 --rps 20 --duration 30
  http 8081 one-rps60 --rps 60 --duration 30 --processes 4
  curl -s http://127.0.0.1:8081/metrics > "$res/one-metrics.txt"
  stop one
  log "GPU test: a fresh start's helpers"
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_engine_gpu.py -k fresh_start 2>&1 | tail -5 \
    | tee -a "$res/progress"
  pack
  exit 0
fi
start three-mps 8081 -- $three
grep -i "mps" "$res/three-mps.log" | cut -c1-200 | tee -a "$res/progress"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv | tee -a "$res/progress"
clone_voice 8081 speaker1
log "MPS: 3 x 20 req/s"
mixed mps speaker1
curl -s http://127.0.0.1:8081/metrics > "$res/mps-metrics.txt"
log "MPS: cv and clone at 20 req/s, the VoiceDesign engine SIGKILLed 10 s in"
loaders=()
http 8081 kill-cv --rps 20 --duration 30 --model cv & loaders+=($!)
http 8081 kill-clone --rps 20 --duration 30 --model clone --voice speaker1 & loaders+=($!)
sleep 14
victim=$(pgrep -f "engine_process.*voice_design" | head -1)
log "SIGKILL engine pid $victim"; kill -KILL "$victim"
wait "${loaders[@]}"
sleep 20
grep -E "exited with|restarting|engine [0-9].*pid" "$res/three-mps.log" | cut -c1-200 | tee -a "$res/progress"
http 8081 after-kill-design --rps 5 --duration 10 --model design --instructions "$DESIGN"
log "SIGKILL the supervisor"
kill -KILL "$(cat "$res/three-mps.pid")"; sleep 8
log "left 8 s after: talkgate $(pgrep -c -f talkgate.processes), MPS:"; mps_left
pkill -KILL -f talkgate.processes; pkill -KILL -u "$(id -u)" nvidia-cuda-mps; sleep 2

start three-off 8081 -- $three --mps off
grep -i "mps" "$res/three-off.log" | cut -c1-200 | tee -a "$res/progress"
clone_voice 8081 speaker2
log "no MPS: 3 x 20 req/s"
mixed off speaker2
stop three-off

start one 8081 -- --model /tmp/ck-1.7b-custom_voice
log "one model: 20 req/s"
http 8081 one-rps20 --rps 20 --duration 30
stop one
mps_left
pack
