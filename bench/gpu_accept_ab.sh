#!/usr/bin/env bash
# Issue 44: an earlier tree (`git archive REV talkgate | tar -x -C .e2e/before`) against this one at 512 native Opus
# streams of 0.6B, both served at once on one H200 (`--max-contexts 512`, ports 8081 and 8082: one start's wait for
# both), then RUNS rounds (default "1 2") of 512 streams started over 2 s, medium texts, 14 s, against each in turn
# (the other one idle); each run's pauses by bench/stalls.py.
#   setsid bash bench/gpu_accept_ab.sh > /tmp/accept-ab.out 2>&1 < /dev/null &     # about 8 minutes fresh: both
#   servers ready 130 s and their graphs captured 285 s after start (2026-12-02), then RUNS x 2 runs of ~30 s
BENCH=${BENCH:-accept-ab}
. "$(dirname "$0")/gpu_serve.sh"
[ -f /tmp/ck-0.6b/config.json ] || tg checkpoint create /tmp/ck-0.6b --preset 0.6b --variant custom_voice | tail -1
start_in "$tree/.e2e/before" before 8081 TALKGATE_CACHE=/tmp/tgc-before -- --model /tmp/ck-0.6b --max-contexts 512 &
start after 8082 TALKGATE_CACHE=/tmp/tgc-after -- --model /tmp/ck-0.6b --max-contexts 512 &
wait
for run in ${RUNS:-1 2}; do
  for which in before after; do
    port=8081; [ "$which" = after ] && port=8082
    name=$which-c512-$run
    load "$port" "$name" --protocol native --encoding opus --concurrency 512 --duration 14 --ramp 2 --processes 4 \
      --ttfa-limit-ms 150
    python3 -m bench.stalls "$res/$name/requests.json" > "$res/$name-stalls.md"
    log "$name: $(head -1 "$res/$name-stalls.md")"
    pack
  done
done
stop before; stop after
log "done"; pack
