#!/usr/bin/env bash
# Issues 45 and 46 on one H200, one call series: a new context's first frame launched apart from the running rows'
# (synth/engine.py first_frames_apart) and the persistent kernels launched as cooperative grids, against the
# earlier tree (a `git archive REV talkgate` in .e2e/before, carried):
#   1. bench.persistent_mps: one process, cooperative then plain (what a cooperative launch costs); three processes
#      as clients of one CUDA MPS daemon, cooperative (must not stall);
#   2. each tree in turn (the earlier first): one 1.7B CustomVoice server, default flags, --trace-latency: OpenAI
#      HTTP PCM at 1, 20, 100 and 135 req/s; then three 1.7B models (CustomVoice, Base, VoiceDesign, MPS: the
#      default) under the mixed load, 3 x 20 req/s;
#   3. last (the GPU may hang in it): three MPS clients with plain launches.
# PART=probe: 1 and 3 only; PART=ab: 2 only, at the rates in RATES (default "1 20 100 135"). Results: /tmp/res-first.tgz (copy it to $OUT from a poll call); progress: $RES/progress.
#   git archive REV talkgate | tar -x -C .e2e/before
#   setsid bash bench/gpu_first_frames.sh > /tmp/first.out 2>&1 < /dev/null &
BENCH=first
. "$(dirname "$0")/gpu_serve.sh"
before=$tree/.e2e/before
export TALKGATE_CACHE=/tmp/tgc-first
LOAD_TIMEOUT_S=200
part=${PART:-all}

probe() {   # probe NAME ARGS...: bench.persistent_mps, its JSON line into progress
  timeout 900 python3 -m bench.persistent_mps --json "$res/probe-$1.json" "${@:2}" > "$res/probe-$1.txt" 2>&1
  log "probe $1: $(tail -1 "$res/probe-$1.txt" | cut -c1-300)"
}
mps_daemon() {  # mps_daemon start|stop: a daemon of this script's own for the probes
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-probe/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-probe/log
  if [ "$1" = start ]; then
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"; nvidia-cuda-mps-control -d
  else
    echo quit | timeout 10 nvidia-cuda-mps-control; sleep 1
    pkill -9 -f nvidia-cuda-mps-server; pkill -9 -f "nvidia-cuda-mps-control -d"
  fi
  [ "$1" = stop ] && unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

if [ "$part" != ab ]; then
  log "probe: one process alone, then three MPS clients (cooperative grids)"
  probe solo-coop --procs 1 --seconds 10
  probe solo-plain --procs 1 --seconds 10 --plain
  mps_daemon start
  probe mps3-coop --procs 3 --seconds 20
  mps_daemon stop
  pack
fi

if [ "$part" != probe ]; then
  checkpoints custom_voice base voice_design
  three="--model cv=/tmp/ck-1.7b-custom_voice --model clone=/tmp/ck-1.7b-base --model design=/tmp/ck-1.7b-voice_design"
  DESIGN="A warm, calm female voice, middle-aged, speaking slowly and clearly."
  for which in before after; do
    dir=$tree; [ $which = before ] && dir=$before
    # the server from its tree (python -m puts the working folder first on the path); the client is this tree's
    (cd "$dir" && export PYTHONPATH=$dir:/tmp/site && start "$which-one" 8081 -- --model /tmp/ck-1.7b-custom_voice \
      --trace-latency "$res/trace.jsonl")
    for rate in ${RATES:-1 20 100 135}; do
      case $rate in
        1) traced "$which-rps1" --protocol openai --lang en --rps 1 --duration 40 --processes 1 ;;
        20) traced "$which-rps20" --protocol openai --lang en --rps 20 --duration 30 --processes 2 ;;
        *) traced "$which-rps$rate" --protocol openai --lang en --rps "$rate" --duration 20 --processes 4 ;;
      esac
    done
    kill -TERM "$(cat "$res/$which-one.pid")"; gone "$(cat "$res/$which-one.pid")"
    pack
    (cd "$dir" && export PYTHONPATH=$dir:/tmp/site && start "$which-three" 8081 -- $three --trace-latency "$res/trace.jsonl")
    grep -E "MPS" "$res/$which-three.log" | cut -c12-200 | tee -a "$res/progress"
    clone_voice 8081 speaker1
    : > "$res/trace.jsonl"
    loaders=()
    load 8081 "$which-three-cv" --protocol openai --lang en --rps 20 --duration 30 --processes 2 --model cv & loaders+=($!)
    load 8081 "$which-three-clone" --protocol openai --lang en --rps 20 --duration 30 --processes 2 --model clone \
      --voice speaker1 & loaders+=($!)
    load 8081 "$which-three-design" --protocol openai --lang en --rps 20 --duration 30 --processes 2 --model design \
      --instructions "$DESIGN" & loaders+=($!)
    wait "${loaders[@]}"
    cp "$res/trace.jsonl" "$res/trace-$which-three.jsonl"
    python3 -m bench.latency_trace "$res/trace-$which-three.jsonl" > "$res/budget-$which-three.txt" 2>&1
    grep -E "total" "$res/budget-$which-three.txt" | sed "s/^/$which-three /" | tee -a "$res/progress"
    kill -TERM "$(cat "$res/$which-three.pid")"; gone "$(cat "$res/$which-three.pid")"
    pack
  done
fi

if [ "$part" != ab ]; then
  log "probe: three MPS clients, plain launches (last: a stall leaves the GPU waiting)"
  mps_daemon start
  probe mps3-plain --procs 3 --seconds 20 --plain
  mps_daemon stop
  pack
fi
log "done"
