#!/usr/bin/env bash
# Issue 44: the stream lead (serve --stream-lead, synth/scheduler.py) at 1,024 and 512 native Opus 48-kHz streams of
# 0.6B, off (--stream-lead 0) against on (--stream-lead 2, the default since f5ad1f0), on one H200. 1,024 streams
# first: an engine process of 1,024 slots takes ~100 GiB of the GPU (2026-12-02: two of them ran out of memory at
# start), so each is served alone in turn (--max-contexts 1024 --max-batch 512, what an H200 alone gets by default;
# --max-connections 2048), on first, RUNS_1024 rounds (default "1"). Then 512 streams: both served at once (ports 8081
# and 8082, --max-contexts 512 each), RUNS rounds (default "1") against each in turn (the other one idle). One compile
# cache for all (the lead changes no kernel: the first start fills it, ~260 s to graphs; the later ones ~115 s). Every
# run: started over 2 s, medium texts (BUCKET: all for every length), 20 s (8 client processes for 1,024 streams, 4
# for 512); its pauses by bench/stalls.py. PARTS (default "1024 512"): which of the two run.
#   setsid bash bench/gpu_lead_ab.sh > /tmp/lead-ab.out 2>&1 < /dev/null &
BENCH=${BENCH:-lead-ab}
. "$(dirname "$0")/gpu_serve.sh"
[ -f /tmp/ck-0.6b/config.json ] || tg checkpoint create /tmp/ck-0.6b --preset 0.6b --variant custom_voice | tail -1
model=(--model /tmp/ck-0.6b)
lead() { if [ "$1" = on ]; then echo "--stream-lead 2"; else echo "--stream-lead 0"; fi; }
streams() {     # streams N CLIENT_PROCESSES ROUND WHICH...
  local n=$1 procs=$2 round=$3 which port name; shift 3
  for which in "$@"; do
    port=8081; [ "$which" = on ] && port=8082
    name=$which-c$n-$round
    load "$port" "$name" --protocol native --encoding opus --concurrency "$n" --max-in-flight "$n" --duration 20 \
      --ramp 2 --processes "$procs" --ttfa-limit-ms 150 --bucket "${BUCKET:-medium}"
    python3 -m bench.stalls "$res/$name/requests.json" > "$res/$name-stalls.md"
    log "$name: $(head -1 "$res/$name-stalls.md")"
    pack
  done
}
parts=" ${PARTS:-1024 512} "
[[ $parts == *" 1024 "* ]] && for which in on off; do
  port=8081; [ "$which" = on ] && port=8082
  start "$which-1024" "$port" TALKGATE_CACHE=/tmp/tgc -- "${model[@]}" --max-contexts 1024 --max-batch 512 \
    --max-connections 2048 $(lead "$which")
  for run in ${RUNS_1024:-1}; do streams 1024 8 "$run" "$which"; done
  stop "$which-1024"
done
if [[ $parts == *" 512 "* ]]; then
  start off 8081 TALKGATE_CACHE=/tmp/tgc -- "${model[@]}" --max-contexts 512 $(lead off) &
  start on 8082 TALKGATE_CACHE=/tmp/tgc -- "${model[@]}" --max-contexts 512 $(lead on) &
  wait
  for run in ${RUNS:-1}; do streams 512 4 "$run" off on; done
  stop off; stop on
fi
log "done"; pack
