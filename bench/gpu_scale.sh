#!/usr/bin/env bash
# Issue 23's targets on one GPU machine, one model per call (each fits a 10-minute call):
#   bench/gpu_scale.sh 0.6b   talkgate serve (default flags), native Opus 48 kHz, medium bucket, 64 / 128 /
#                                      256 / 512 concurrent streams started over 2 s (--ramp), then 512 English
#                                      streams so, then 512 all at once (a burst); then bench/ipc.py on the CPUs
#   bench/gpu_scale.sh 1.7b   OpenAI HTTP PCM, texts up front, natural lengths: talkgate serve (default
#                                      flags) at 1 req/s, a sweep of short texts and one of all, then the single
#                                      process (--workers 0) at 1 req/s
# TALKGATE_CACHE (the compile cache) passes through: a cache filled before (gpu_coldstart.sh) makes a warm start.
# Setup as bench/gpu_env.sh (wheels in .e2e/ and .whl/ of the tree the command runs in). Results:
# $OUT/scale-<size>.tgz
# A dry run of the script on a CPU machine: SETUP=0 DEVICE=cpu PRESET=tiny bench/gpu_scale.sh 0.6b
set -uo pipefail
size=${1:?0.6b or 1.7b}
out=${OUT:-/tmp/out}; res=/tmp/res-scale-$size; mkdir -p "$out" "$res"
tree=$(cd "$(dirname "$0")/.." && pwd)             # the repository root (bench/ is in it)
log() { echo "[$(date +%T)] $*"; }
if [ "${SETUP:-1}" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .e2e/*.whl .whl/*.whl || exit 1
  cp .e2e/libopus.so.0 /usr/lib/x86_64-linux-gnu/ && ldconfig
fi
cd "$tree"                                         # `python -m` puts the working directory first on the path
export PYTHONPATH=$tree:/tmp/site PYTHONUNBUFFERED=1
device=${DEVICE:-cuda}
tg() { python3 -m talkgate "$@"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null; nproc; date -u;
  python3 -c "import torch, aiohttp, zmq, talkgate; print('torch', torch.__version__, 'aiohttp', aiohttp.__version__,
'pyzmq', zmq.__version__, talkgate.__file__)"; } | tee "$res/versions.txt"

ck=/tmp/ck-$size
[ -f "$ck/config.json" ] || { log "checkpoint $size"; tg checkpoint create "$ck" --preset "${PRESET:-$size}" \
  --variant custom_voice | tail -1; }

serve() {   # serve NAME PORT ARGS...: start, wait for ready and for every graph (the other buckets follow ready)
  local name=$1 port=$2; shift 2
  python3 -m talkgate serve --model "$ck" --device "$device" --port "$port" "$@" > "$res/$name.log" 2>&1 &
  echo $! > "$res/$name.pid"
  for _ in $(seq 900); do grep -q "talkgate: ready" "$res/$name.log" && break; sleep 0.5; done
  log "$name: $(grep -m1 'talkgate: ready' "$res/$name.log")"
  # measure a long-warm server: the other buckets' graphs are captured in the first quiet seconds after ready
  for _ in $(seq 240); do grep -q "all [0-9]* graphs captured" "$res/$name.log" && break; sleep 0.5; done
  grep -m2 "graphs captured\|slots" "$res/$name.log" | cut -c1-200
}
stop() { kill -TERM "$(cat "$res/$1.pid")"; wait "$(cat "$res/$1.pid")"; }
load() {    # load PORT OUT ARGS...
  local port=$1 dir=$2; shift 2
  timeout 150 python3 -m talkgate bench --url "http://127.0.0.1:$port" --warmup 4 --out "$res/$dir" "$@" 2>&1 \
    | grep -E "^(concurrency|rps|highest|warm-up)" | tail -3
  curl -s "http://127.0.0.1:$port/metrics" > "$res/$dir/metrics-after.txt"
}
threads() { sleep "$1"; top -H -b -n 1 -w 180 | head -45 > "$res/$2"; }

if [ "$size" = 0.6b ]; then
  serve multi 8080
  for c in 64 128 256 512; do
    log "native opus 48 kHz, $c streams started over 2 s"
    [ "$c" = 512 ] && threads 15 top-512.txt &
    load 8080 c$c --protocol native --encoding opus --concurrency $c --duration 14 --ramp 2 --bucket medium \
      --processes 4 --ttfa-limit-ms 150
  done
  log "native opus 48 kHz, 512 English streams started over 2 s"
  load 8080 c512-en --protocol native --encoding opus --concurrency 512 --duration 14 --ramp 2 --bucket medium \
    --lang en --processes 4 --ttfa-limit-ms 150
  log "native opus 48 kHz, 512 streams all at once"
  load 8080 c512-burst --protocol native --encoding opus --concurrency 512 --duration 14 --bucket medium \
    --processes 4 --ttfa-limit-ms 150
  stop multi
  log "ipc"; timeout 120 python3 -m bench.ipc --batches 1,256 --workers 1,8 --steps 600 --period-ms 20 \
    --json "$res/ipc.json" 2>&1 | grep batch
else
  serve multi 8080
  log "workers: openai 1 rps"; load 8080 multi-rps1 --protocol openai --rps 1 --duration 60 --lang en
  sweep() {   # sweep OUT LEVELS ARGS...
    local dir=$1 levels=$2; shift 2
    timeout 170 python3 -m talkgate bench --url http://127.0.0.1:8080 --warmup 4 --out "$res/$dir" \
      --protocol openai --sweep "$levels" --duration 10 --processes 4 --ttfa-limit-ms 100 "$@" 2>&1 \
      | grep -E "^(concurrency|rps|highest|warm-up)" | tail -6
    curl -s http://127.0.0.1:8080/metrics > "$res/$dir/metrics-after.txt"
  }
  log "workers: openai sweep, short texts (voice-agent turns)"
  threads 20 top-sweep.txt &
  sweep sweep-short 100,150,200,250,300 --bucket short
  log "workers: openai sweep, all buckets"
  sweep sweep-all 50,75,100 --bucket all
  stop multi
  serve single 8080 --workers 0 --max-contexts 64
  log "single process: openai 1 rps"; load 8080 single-rps1 --protocol openai --rps 1 --duration 60 --lang en
  stop single
fi
tar czf "$out/scale-$size.tgz" -C /tmp "res-scale-$size"
log "done"
