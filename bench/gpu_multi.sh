#!/usr/bin/env bash
# Issues 28 and 51 on a 2-GPU machine (nvidia-h200-x2): `talkgate serve --gpus all` (one engine process per GPU)
# against `--gpus 0` on the same machine, one run for both models (about 14 minutes: start it detached and collect
# it over several calls, see below).
#   1.7B  OpenAI HTTP PCM, open loop, English medium texts, text-rule lengths: the highest rate with 0 underruns,
#         0 errors and p95 TTFA <= 100 ms on two GPUs and on one (LEVELS_TWO, LEVELS_ONE); then, on two GPUs at a
#         load one GPU carries, engine 1 killed with SIGKILL: errors by code, time until it is ready again, the
#         contexts it takes afterwards.
#   0.6B  native WebSocket, Opus 48 kHz, medium bucket, English (see docs/benchmarks.md for why): the most
#         concurrent streams with 0 underruns and 0 errors on two GPUs and on one (STREAMS_TWO, STREAMS_ONE).
# The load generator runs in 8 processes; each run's summary reports their loop lag, and its wall and CPU time
# (client-time.txt: wall, user, system seconds) say how many cores it took.
# Both models are compiled first with `talkgate warmup`, one per GPU at once, so that every serve starts warm.
# Placement: every engine's slots are sampled from /metrics every 2 s during each run (slots-*.txt).
# Setup as bench/gpu_env.sh (the wheels in .e2e/, .whl/ if there is one). Results: $OUT/multi.tgz; progress:
# $RES/progress.
# Detached: setsid bash bench/gpu_multi.sh > /tmp/multi.out 2>&1 < /dev/null &
#           then wait for "done" in /tmp/res-multi/progress (a later call: the same machine while it is warm).
# A dry run on a CPU machine: SETUP=0 DEVICE=cpu PRESET=tiny QUICK=1 bench/gpu_multi.sh
set -uo pipefail
out=${OUT:-/tmp/out}; res=${RES:-/tmp/res-multi}; rm -rf "$res"; mkdir -p "$out" "$res"
tree=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "[$(date +%T)] $*" | tee -a "$res/progress"; }
if [ "${SETUP:-1}" = 1 ]; then
  (cd "$tree" && . bench/gpu_env.sh) || exit 1     # the wheels into /tmp/site, libopus
fi
cd "$tree"
export PYTHONPATH=$tree:/tmp/site PYTHONUNBUFFERED=1 TALKGATE_CACHE=/tmp/tgc
device=${DEVICE:-cuda}
# slots an engine: 640 for 0.6B, so that a level of 512 streams a GPU is not refused for slots freed a moment after
# their client's next start
if [ "$device" = cpu ]; then gpus_all=(--engines 2); gpus_one=(--engines 1); slots=(--max-contexts 16); slots06=("${slots[@]}")
else gpus_all=(--gpus all); gpus_one=(--gpus 0); slots=(--max-contexts 512); slots06=(--max-contexts 640); fi
tg() { python3 -m talkgate "$@"; }
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null; nproc; date -u;
  env | grep -E "NCCL_NVLS|MULTICAST|NVSHMEM" ;
  python3 -c "import torch, aiohttp, zmq; print('torch', torch.__version__, 'aiohttp', aiohttp.__version__,
'pyzmq', zmq.__version__)"; git -C "$tree" rev-parse --short HEAD 2>/dev/null; } > "$res/versions.txt" 2>&1
cat "$res/versions.txt"

for size in 1.7b 0.6b; do
  tg checkpoint create /tmp/ck-$size --preset "${PRESET:-$size}" --variant custom_voice | tail -1
done
if [ "$device" = cuda ]; then
  log "warmup: 1.7B on GPU 0 and 0.6B on GPU 1 at once"
  CUDA_VISIBLE_DEVICES=0 tg warmup --model /tmp/ck-1.7b "${slots[@]}" > "$res/warmup-1.7b.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 tg warmup --model /tmp/ck-0.6b "${slots06[@]}" > "$res/warmup-0.6b.log" 2>&1 &
  # bench/gpu_models.sh's float16 decoder, compiled now while nothing is measured
  [ "${FP16_WARMUP:-0}" = 1 ] && CUDA_VISIBLE_DEVICES=0 tg warmup --model /tmp/ck-1.7b "${slots[@]}" \
    --decoder-dtype float16 > "$res/warmup-1.7b-fp16.log" 2>&1 &
  wait
  log "warmup done: $(tail -1 "$res/warmup-1.7b.log" | cut -c1-160) | $(tail -1 "$res/warmup-0.6b.log" | cut -c1-160)"
fi

sampler() {   # sampler PORT FILE: every engine's slot gauges every 2 s until killed
  while :; do
    echo "$(date +%s.%N) $(curl -s "http://127.0.0.1:$1/metrics" | grep -E '^talkgate_engine_(slots_free|slots|ready)\{' | tr '\n' ' ')"
    sleep 2
  done >> "$2"
}
serve() {   # serve NAME SIZE ARGS...: start, wait for ready and for every engine's other graphs (a long-warm server)
  local name=$1 size=$2; shift 2
  local t0=$SECONDS
  python3 -m talkgate serve --model /tmp/ck-$size --device "$device" --port 8080 "${slots[@]}" "$@" > "$res/$name.log" 2>&1 &
  echo $! > "$res/$name.pid"
  for _ in $(seq 1200); do grep -q "talkgate: ready" "$res/$name.log" && break; sleep 0.5; done
  log "$name: ready $((SECONDS - t0)) s after start ($(grep -c 'engine [0-9]*: .*pid' "$res/$name.log") engines)"
  local n; n=$(grep -c 'engine [0-9]*: .*pid' "$res/$name.log")
  for _ in $(seq 240); do [ "$(grep -c 'all [0-9]* graphs captured' "$res/$name.log")" -ge "$n" ] && break; sleep 0.5; done
  log "$name: all graphs captured $((SECONDS - t0)) s after start"
  sampler 8080 "$res/slots-$name.txt" & echo $! > "$res/$name.sampler"
}
stop() {
  kill "$(cat "$res/$1.sampler")" 2>/dev/null
  kill -TERM "$(cat "$res/$1.pid")"; wait "$(cat "$res/$1.pid")"
  curl -s http://127.0.0.1:8080/health > /dev/null && sleep 3
}
load() {    # load OUTDIR ARGS...
  local dir=$1; shift
  local TIMEFORMAT="%R %U %S"
  { time timeout 400 python3 -m talkgate bench --url http://127.0.0.1:8080 --warmup 4 --out "$res/$dir" \
      --max-in-flight 4096 --processes 8 "$@" > "$res/$dir.txt" 2>&1; } 2> "$res/$dir-client-time.txt"
  grep -E "^(concurrency|rps|highest|warm-up)" "$res/$dir.txt" | tee -a "$res/progress"
  curl -s http://127.0.0.1:8080/metrics > "$res/$dir-metrics.txt"
}
quick() { [ "${QUICK:-0}" = 1 ] && echo "$1" || echo "$2"; }

# ---- 1.7B: two GPUs, the kill, one GPU
serve two-1.7b 1.7b "${gpus_all[@]}"
log "1.7B two GPUs: openai sweep"
http=(--protocol openai --lang en --bucket medium --duration 10 --ttfa-limit-ms 100)
load sweep-two-1.7b "${http[@]}" --sweep "$(quick 1,2 "${LEVELS_TWO:-200,240,270,300}")"
log "1.7B two GPUs: engine 1 killed 10 s into a $(quick 2 100) req/s run"
load kill-1.7b --protocol openai --lang en --bucket medium --rps "$(quick 2 100)" --duration "$(quick 40 50)" &
loader=$!
sleep 10
epid=$(grep -oP 'engine 1: .*\(pid \K[0-9]+' "$res/two-1.7b.log" | tail -1)
t_kill=$(date +%s.%N); kill -KILL "$epid"; log "killed engine 1 (pid $epid)"
for _ in $(seq 600); do
  sleep 0.5
  curl -s http://127.0.0.1:8080/metrics | grep -q '^talkgate_engine_ready{engine="1"} 1.0' || continue
  curl -s http://127.0.0.1:8080/metrics | grep -q '^talkgate_engine_ready{engine="1"} 1.0' && break
done
log "engine 1 ready again $(python3 -c "import time; print(round(time.time() - $t_kill, 1))") s after the kill"
wait $loader
stop two-1.7b
serve one-1.7b 1.7b "${gpus_one[@]}"
log "1.7B one GPU: openai sweep"
load sweep-one-1.7b "${http[@]}" --sweep "$(quick 1,2 "${LEVELS_ONE:-110,125,140,155}")"
stop one-1.7b

# ---- 0.6B: native Opus streams started over 2 s (as in issue 23's runs), two GPUs then one
slots=("${slots06[@]}")
opus=(--protocol native --encoding opus --bucket medium --lang en --duration 12 --ramp 2 --ttfa-limit-ms 3000
      --concurrency 16 --processes 16)
serve two-0.6b 0.6b "${gpus_all[@]}"
log "0.6B two GPUs: opus streams"
load sweep-two-0.6b "${opus[@]}" --sweep "$(quick 16 "${STREAMS_TWO:-768,896,1024,1152}")"
stop two-0.6b
serve one-0.6b 0.6b "${gpus_one[@]}"
log "0.6B one GPU: opus streams"
load sweep-one-0.6b "${opus[@]}" --sweep "$(quick 16 "${STREAMS_ONE:-384,448,512,576}")"
stop one-0.6b

tar czf "$out/multi.tgz" -C "$(dirname "$res")" "$(basename "$res")"
log "done"
