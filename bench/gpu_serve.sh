# Sourced by bench/gpu_latency.sh and bench/gpu_models.sh: their preamble (results in $RES, the archive in $OUT,
# the device's packages set up unless SETUP=0, versions written down) and the helpers that start, load and stop a
# `talkgate serve`. Set BENCH (the script's short name: /tmp/res-$BENCH by default) before sourcing.
#   start NAME PORT [VAR=VALUE ...] -- ARGS...   serve; wait for ready and for every engine's graphs
#   start_in TREE NAME PORT ...                  start, the server from TREE's talkgate (an earlier tree's)
#   stop NAME                                    SIGTERM, and wait for it to end
#   load PORT DIR ARGS...                        talkgate bench (English medium texts), its own CPU time beside it
#   checkpoints VARIANT...                       random-weight 1.7B checkpoints in /tmp/ck-1.7b-VARIANT
#   clone_voice PORT NAME                        a voice cloned from a made-up 6 s sample
#   traced NAME ARGS...                          load on port 8081 of a server started with --trace-latency
#                                                $res/trace.jsonl; its requests' traces and stage budget kept
#   kept_trace NAME [FILE]                       that for a trace begun by hand (`: > FILE`, default
#                                                $res/trace.jsonl; loads run at once)
#   tree_of NAME                                 the folder of tree NAME: after is this one, any other .e2e/NAME
#   each_tree LOADS                              the earlier tree, then this one, served in turn while LOADS runs
#                                                (with --trace-latency to TRACE_FILE, which LOADS sees, unless
#                                                UNTRACED=1); LOAD_TREES (default "before after"): which trees
#   both_trees LOADS                             the same at once on a machine of two GPUs: before on GPU 0 (port
#                                                8081), after on GPU 1 (port 8082), each LOADS given PORT and
#                                                TRACE_FILE
#   gpu_tests PYTEST_ARGS...                     with GPU_TESTS=1: pytest (400 s at most), its tail in progress
#   gone PID                                     wait (up to 60 s) for a process to end
#   profile NAME                                 py-spy of the engine process and two workers, 8 s
#   pack                                         $res as $res.tgz (a poll call copies it to $OUT)
#   mixed_load NAME                              three 1.7B models on port 8081 (cv, clone, design) at 20 req/s each
#                                                for 20 s: the default voice, speaker1 cloned, a designed voice
#   alone TREE PREFIX VARIANT...                 each 1.7B variant served alone from TREE on port 8081 at 20 req/s,
#                                                its voice (runs PREFIX-VARIANT)
set -uo pipefail
out=${OUT:-/tmp/out}; res=${RES:-/tmp/res-$BENCH}; rm -rf "$res"; mkdir -p "$out" "$res"
echo $$ > "$res/pid"                             # gpu_poll.sh stops waiting once this process is gone
tree=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { echo "[$(date +%T)] $*" | tee -a "$res/progress"; }
if [ "${SETUP:-1}" = 1 ]; then
  (cd "$tree" && . bench/gpu_env.sh) || exit 1
fi
cd "$tree"
export PYTHONPATH=$tree:/tmp/site PYTHONUNBUFFERED=1
tg() { python3 -m talkgate "$@"; }
{ git -C "$tree" rev-parse --short HEAD; git -C "$tree" status --short -- talkgate bench | head -20; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader
  python3 -c 'import torch, aiohttp, zmq; print(torch.__version__, aiohttp.__version__, zmq.__version__)'; nproc; } \
  > "$res/versions.txt" 2>&1

checkpoints() {
  local v
  for v in "$@"; do
    [ -f /tmp/ck-1.7b-$v/config.json ] || tg checkpoint create /tmp/ck-1.7b-$v --preset 1.7b --variant $v | tail -1
  done
  log "checkpoints made: $*"
}

start() {
  local name=$1 port=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  local t0=$SECONDS n
  env "${envs[@]}" python3 -m talkgate serve --port "$port" "$@" > "$res/$name.log" 2>&1 &
  echo $! > "$res/$name.pid"
  log "$name: started"
  # packed every 30 s while it warms up: a call cut before the server is ready still brings back its log (a 0.6B
  # server of 1,024 contexts was not ready 370 s after its start on a fresh H100, 2026-12-06, and left nothing)
  for i in $(seq 1200); do grep -q "talkgate: ready" "$res/$name.log" && break; (( i % 60 )) || pack; sleep 0.5; done
  log "$name: ready $((SECONDS - t0)) s after start"
  n=$(grep -c 'engine [0-9]*.*: .*pid' "$res/$name.log")
  for _ in $(seq 800); do [ "$(grep -c 'all [0-9]* graphs captured' "$res/$name.log")" -ge "$n" ] && break; sleep 0.5; done
  log "$name: all graphs of $n engine(s) captured $((SECONDS - t0)) s after start"
}

# the server from TREE (python -m puts the working folder first on the path); the client is this tree's
start_in() { local dir=$1; shift; (cd "$dir" && export PYTHONPATH=$dir:/tmp/site && start "$@"); }

# a server that start_in started is not this shell's child: wait cannot, gone can
stop() { local pid; pid=$(cat "$res/$1.pid"); kill -TERM "$pid"; wait "$pid" 2>/dev/null || gone "$pid"; }

load() {   # load PORT NAME ARGS: killed after LOAD_TIMEOUT_S, by default the larger of 300 s and --duration + 120 s
  local port=$1 dir=$2; shift 2
  local TIMEFORMAT="%R %U %S" arg prev="" limit=300
  for arg in "$@"; do [ "$prev" = --duration ] && limit=$(( ${arg%.*} + 120 > limit ? ${arg%.*} + 120 : limit )); prev=$arg; done
  { time timeout "${LOAD_TIMEOUT_S:-$limit}" python3 -m talkgate bench --url "http://127.0.0.1:$port" --warmup 4 \
      --out "$res/$dir" --bucket medium "$@" > "$res/$dir.txt" 2>&1; } 2> "$res/$dir-client-time.txt"
  grep -E "^(concurrency|rps|highest|warm-up)" "$res/$dir.txt" | tee -a "$res/progress"
}

clone_voice() {
  local port=$1 name=$2
  python3 - <<'PY'
import numpy as np, soundfile
t = np.arange(24000 * 6) / 24000
soundfile.write("/tmp/ref.wav", 0.3 * np.sin(2 * np.pi * 180 * t * (1 + 0.1 * np.sin(3 * t))), 24000)
PY
  curl -s -F audio_sample=@/tmp/ref.wav -F name="$name" -F consent=bench "http://127.0.0.1:$port/v1/audio/voices" \
    > "$res/clone.json"
  log "cloned: $(cut -c1-160 "$res/clone.json")"
}

traced() {
  local name=$1; shift
  : > "$res/trace.jsonl"
  load 8081 "$name" "$@"
  kept_trace "$name"
}

kept_trace() {   # kept_trace NAME [FILE]: the trace since the last `: > FILE`, kept, and its stage budget
  cp "${2:-$res/trace.jsonl}" "$res/trace-$1.jsonl"
  python3 -m bench.latency_trace "$res/trace-$1.jsonl" > "$res/budget-$1.txt" 2>&1
  grep -E "total|text wait" "$res/budget-$1.txt" | sed "s/^/$1 /" | tee -a "$res/progress"
}

gpu_tests() {
  [ "${GPU_TESTS:-0}" = 1 ] || return 0
  log "GPU tests"
  timeout 400 python3 -m pytest -q -p no:cacheprovider -p no:hypothesispytest "$@" > "$res/gpu-tests.txt" 2>&1
  tail -3 "$res/gpu-tests.txt" | tee -a "$res/progress"
  pack
}

gone() { for _ in $(seq 120); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.5; done; }

# py-spy (100 Hz, 8 s; --nonblocking: the processes are never paused) of the engine process (0) and two workers (1, 2)
# of the one server running: $res/NAME-pyspy-N.raw (a line a stack: frames, then its samples)
profile() {
  local pid i=0
  for pid in $(pgrep -f talkgate.processes.engine_process | head -1) $(pgrep -f talkgate.processes.worker | head -2); do
    timeout 30 /tmp/site/bin/py-spy record --nonblocking -r 100 -d 8 -f raw -o "$res/$1-pyspy-$i.raw" -p "$pid" \
      > "$res/$1-pyspy-$i.txt" 2>&1 &
    i=$((i + 1))
  done
  wait
}

# written aside, then moved: both_trees' two loads pack at once, and a poll may copy it meanwhile
pack() { local tmp=$res.tgz.$BASHPID; tar czf "$tmp" -C "$(dirname "$res")" "$(basename "$res")" 2>/dev/null; mv -f "$tmp" "$res.tgz"; }

tree_of() { if [ "$1" = after ]; then echo "$tree"; else echo "$tree/.e2e/$1"; fi; }

# The earlier tree (a `git archive REV talkgate` in .e2e/before) and then this one, each served on port 8081
# (`talkgate serve` default flags and --trace-latency, /tmp/ck-1.7b-custom_voice) while the function LOADS runs its
# loads with the tree's name (before, after); the engine's step and loop metrics kept, then the server stopped.
each_tree() {
  local loads=$1 which file="$res/trace.jsonl" trace=()
  if [ "${UNTRACED:-0}" = 1 ]; then file=""; else trace=(--trace-latency "$file"); fi
  for which in ${LOAD_TREES:-before after}; do
    start_in "$(tree_of "$which")" "$which" 8081 -- --model /tmp/ck-1.7b-custom_voice "${trace[@]}"
    TRACE_FILE=$file "$loads" "$which"
    curl -s "http://127.0.0.1:8081/metrics" | grep -E "^talkgate_engine_(step|loop)" > "$res/$which-metrics.txt"
    stop "$which"
    pack
  done
}

# each_tree where the machine has two GPUs: both trees served at once, one GPU each, so that one call's loads take
# half the time; the GPUs differ as two machines might (their names and clocks are in versions.txt and gpus.txt).
# Each server's trace goes to trace-NAME.jsonl (TRACE_FILE for LOADS, which keeps each load's apart: kept_trace).
both_trees() {
  local loads=$1 trees=(before after) gpu pids=()
  for gpu in 0 1; do
    start_in "$(tree_of "${trees[gpu]}")" "${trees[gpu]}" $((8081 + gpu)) CUDA_VISIBLE_DEVICES=$gpu -- \
      --model /tmp/ck-1.7b-custom_voice --trace-latency "$res/trace-${trees[gpu]}.jsonl" & pids+=($!)
  done
  wait "${pids[@]}"; pids=()
  nvidia-smi --query-gpu=index,name,serial,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv > "$res/gpus.txt"
  for gpu in 0 1; do
    PORT=$((8081 + gpu)) TRACE_FILE=$res/trace-${trees[gpu]}.jsonl "$loads" "${trees[gpu]}" & pids+=($!)
  done
  wait "${pids[@]}"
  for gpu in 0 1; do
    curl -s "http://127.0.0.1:$((8081 + gpu))/metrics" | grep -E "^talkgate_engine_(step|loop)" \
      > "$res/${trees[gpu]}-metrics.txt"
    stop "${trees[gpu]}"
  done
  pack
}

DESIGNED="A warm, calm female voice, middle-aged, speaking slowly and clearly."
mixed_http() { local dir=$1; shift; load 8081 "$dir" --protocol openai --lang en --processes 2 --rps 20 --duration 20 "$@"; }

mixed_load() {
  local name=$1 loaders=()
  [ -f "$res/clone.json" ] || clone_voice 8081 speaker1
  log "$name: 3 x 20 req/s for 20 s"
  mixed_http "$name-cv" --model cv & loaders+=($!)
  mixed_http "$name-clone" --model clone --voice speaker1 & loaders+=($!)
  mixed_http "$name-design" --model design --instructions "$DESIGNED" & loaders+=($!)
  wait "${loaders[@]}"
  curl -s http://127.0.0.1:8081/metrics | grep -E "^talkgate_engine_(lane|step_seconds_(sum|count))" \
    | sed "s/^/$name /" | tee -a "$res/progress"
}

alone() {
  local dir=$1 prefix=$2 m name; shift 2
  for m in "$@"; do
    name=$prefix-$m
    start_in "$dir" "$name" 8081 -- --model "/tmp/ck-1.7b-$m"
    case $m in
      custom_voice) mixed_http "$name" ;;
      base) [ -f "$res/clone.json" ] || clone_voice 8081 speaker1; mixed_http "$name" --voice speaker1 ;;
      voice_design) mixed_http "$name" --instructions "$DESIGNED" ;;
    esac
    stop "$name"
    pack
  done
}
