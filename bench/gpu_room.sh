#!/usr/bin/env bash
# Issue 44 on one H200, one call: room for the load. The earlier tree (a `git archive REV talkgate` in .e2e/before,
# carried: at most 512 slots sized from memory) against this one (at most 1,024), both with a step of at most 256
# rows, then this tree with --max-batch 512 (steps of up to 512 rows, its slots sized from memory beside their
# warm-up). Each from its start, `talkgate serve` default flags but those, --trace-latency, 1.7B CustomVoice random
# weights, OpenAI HTTP PCM, English medium texts, open loop: 1 req/s for 30 s, 20 and 100 req/s for 20 s (traced:
# each load's stage budget), then a sweep of LEVELS req/s, 10 s a level, up to the first level not clean (clean = 0
# underruns and p95 first audio <= 100 ms). GPU memory used after each start and after each sweep.
#   git archive REV talkgate | tar -x -C .e2e/before
#   setsid bash bench/gpu_room.sh > /tmp/room.out 2>&1 < /dev/null &
# Results: /tmp/res-room.tgz (copy it to $OUT from a poll call); progress: $RES/progress.
# PART=start instead: each tree from an empty compile cache (the earlier first), its ready and all-graphs times and
# the slots and rows it chose; then this tree at 200 req/s for 60 s (is the level held, or only buffered in slots?)
# and 1 req/s for 30 s again.
BENCH=room
. "$(dirname "$0")/gpu_serve.sh"
export TALKGATE_CACHE=/tmp/tgc-room
LOAD_TIMEOUT_S=300

checkpoints custom_voice
memory() { log "$1: GPU memory used $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"; }
serve_tree() {          # NAME DIR ARGS...: serve DIR's talkgate on 8081
  local name=$1 dir=$2; shift 2
  (cd "$dir" && export PYTHONPATH=$dir:/tmp/site && start "$name" 8081 -- --model /tmp/ck-1.7b-custom_voice \
    --trace-latency "$res/trace.jsonl" "$@")
  grep -h "ready (" "$res/$name.log" | tail -1 | tee -a "$res/progress"
  grep -h "codec decoder:" "$res/$name.log" | tail -1 | tee -a "$res/progress"
  memory "$name started"
}
sweep() {               # NAME LEVELS
  load 8081 "$1-sweep" --protocol openai --lang en --sweep "$2" --duration 10 --ttfa-limit-ms 100 --processes 4 \
    --max-in-flight 4096
  memory "$1 swept"
}
done_tree() {
  curl -s "http://127.0.0.1:8081/metrics" | grep -E "^talkgate_engine_(step|loop|slots)" > "$res/$1-metrics.txt"
  kill -TERM "$(cat "$res/$1.pid")"; gone "$(cat "$res/$1.pid")"
  pack
}
if [ "${PART:-sweep}" = slots ]; then      # this tree alone from an empty cache: its slots, memory, 20 s at 200 req/s
  export TALKGATE_CACHE=/tmp/tgc-room-slots; rm -rf "$TALKGATE_CACHE"
  serve_tree slots "$tree"
  load 8081 "slots-rps200" --protocol openai --lang en --rps 200 --duration 20 --processes 4 --max-in-flight 4096
  memory "slots loaded"
  done_tree slots
  log "done"
  exit 0
fi
if [ "${PART:-sweep}" = start ]; then
  for which in before after; do
    dir=$tree; [ $which = before ] && dir=$tree/.e2e/before
    export TALKGATE_CACHE=/tmp/tgc-room-$which; rm -rf "$TALKGATE_CACHE"
    serve_tree start-$which "$dir"
    [ $which = after ] && load 8081 "start-after-rps200" --protocol openai --lang en --rps 200 --duration 60 \
      --processes 4 --max-in-flight 4096 && traced "start-after-rps1" --protocol openai --lang en --rps 1 --duration 30 \
      --processes 1
    done_tree start-$which
  done
  log "done"
  exit 0
fi
for which in before after; do
  dir=$tree; [ $which = before ] && dir=$tree/.e2e/before
  serve_tree $which "$dir"
  traced "$which-rps1" --protocol openai --lang en --rps 1 --duration 30 --processes 1
  traced "$which-rps20" --protocol openai --lang en --rps 20 --duration 20 --processes 2
  traced "$which-rps100" --protocol openai --lang en --rps 100 --duration 20 --processes 3
  sweep $which "${LEVELS:-170,190,210,230,250}"
  done_tree $which
done
serve_tree batch512 "$tree" --max-batch 512
traced "batch512-rps1" --protocol openai --lang en --rps 1 --duration 30 --processes 1
sweep batch512 "${LEVELS512:-190,210,230,250,270,290}"
done_tree batch512
log "done"
