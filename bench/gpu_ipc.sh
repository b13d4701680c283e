#!/usr/bin/env bash
# Issue 45 on one H200, one call: the engine boundary's transport (ipc/channel.py) against the earlier tree's ZMQ
# (a `git archive REV talkgate` in .e2e/before, carried):
#   1. python -m bench.wakeup (one-way latency of a small message at a low rate: ZMQ and the socket, the worker's
#      event loop and the engine's poll as receivers) and python -m bench.ipc (the boundary per step, 1 and 256 rows);
#   2. each tree in turn (the earlier first): `talkgate serve` default flags and --trace-latency, OpenAI HTTP PCM and
#      native Opus (whole text), English medium texts, open loop at the rates in RATES (default "1 20 100 150"),
#      each load's stage budget.
#   git archive REV talkgate | tar -x -C .e2e/before
#   setsid bash bench/gpu_ipc.sh > /tmp/ipc.out 2>&1 < /dev/null &
# Results: /tmp/res-ipc.tgz (copy it to $OUT from a poll call); progress: $RES/progress.
BENCH=ipc
. "$(dirname "$0")/gpu_serve.sh"
export TALKGATE_CACHE=/tmp/tgc-ipc
LOAD_TIMEOUT_S=200

python3 -m bench.wakeup --messages 300 --gap-ms 20 --spin > "$res/wakeup.txt" 2>&1
log "wakeup: $(tr '\n' ' ' < "$res/wakeup.txt")"
python3 -m bench.ipc --batches 1,256 --workers 1,8 --steps 600 --period-ms 20 --json "$res/ipc.json" > "$res/ipc.txt" 2>&1
log "ipc: $(grep -E '^batch' "$res/ipc.txt" | tr '\n' ' ')"
pack
checkpoints custom_voice
loads() {
  local which=$1 rate
  for rate in ${RATES:-1 20 100 150}; do
    case $rate in
      1) traced "$which-rps1" --protocol openai --lang en --rps 1 --duration 40 --processes 1
         traced "$which-opus-rps1" --protocol native --encoding opus --tokens-per-second 0 --lang en --rps 1 \
           --duration 40 --processes 1 ;;
      20) traced "$which-rps20" --protocol openai --lang en --rps 20 --duration 30 --processes 2
          traced "$which-opus-rps20" --protocol native --encoding opus --tokens-per-second 0 --lang en --rps 20 \
            --duration 30 --processes 2 ;;
      *) traced "$which-rps$rate" --protocol openai --lang en --rps "$rate" --duration 20 --processes 4 ;;
    esac
    pack
  done
}
each_tree loads
log "done"
