#!/usr/bin/env bash
# Issue 44 (room to hold the load): the Talker's KV allocated by use (synth/pages.py) against whole-slot KV, one H200,
# one call. With GPU_TESTS=1 the GPU tests first, alone (the paged attention kernels compiled). Then, PARTS (default
# "ab 0.6b"):
#   ab    the earlier tree (`git archive REV talkgate | tar -x -C .e2e/before`) and this one served in turn, 1.7B
#         CustomVoice, `talkgate serve` default flags: the slots and KV pages each sized, then OpenAI HTTP PCM, English
#         medium texts, open loop: 1 req/s for 30 s, 20 req/s for 15 s and RATE req/s (default 150) for 20 s
#   0.6b  this tree, 0.6B CustomVoice, default flags: 1,024 native Opus 48-kHz streams (medium texts, started over
#         2 s, 20 s, 8 client processes), its pauses by bench/stalls.py; the KV pages and failures from /metrics
#   before   the same two loads served from the earlier tree (whole slots) with `--max-contexts 1024 --max-batch 512`
#   streams  the 0.6b load twice (ROUNDS) on this tree served with `--max-contexts 1024 --max-batch 512` (the flags of
#         2026-12-02's clean run) and then with default flags (2,048 slots): whether the slots or the pages ramp worse
#   setsid bash bench/gpu_kv_pages_ab.sh > /tmp/kv.out 2>&1 < /dev/null &
BENCH=${BENCH:-kv-pages-ab}
. "$(dirname "$0")/gpu_serve.sh"
pkill -f "parallel_compil[e]" 2>/dev/null
gpu_tests tests/gpu/test_attention.py tests/gpu/test_persistent.py tests/gpu/test_engine_gpu.py
sizing() { grep -hE "slots: [0-9]+|KV pages" "$res/$1.log" | head -3 | sed "s/^/$1 /" | tee -a "$res/progress"; }
kv() { curl -s http://127.0.0.1:8081/metrics | grep -E "^talkgate_engine_(kv_|slots)" | sed "s/^/$1 /" \
  | tee -a "$res/progress"; }
loads() {
  sizing "$1"
  load 8081 "$1-rps1" --protocol openai --lang en --rps 1 --duration 30 --processes 1
  load 8081 "$1-rps20" --protocol openai --lang en --rps 20 --duration 15 --processes 2
  load 8081 "$1-rps${RATE:-150}" --protocol openai --lang en --rps "${RATE:-150}" --duration 20 --processes 4
  kv "$1"
}
parts=" ${PARTS:-ab 0.6b} "
if [[ $parts == *" ab "* ]]; then
  checkpoints custom_voice
  export TALKGATE_CACHE=/tmp/tgc
  UNTRACED=1 each_tree loads
fi
# streams TREE NAME ROUNDS SERVE_ARGS...: 0.6B served from TREE with SERVE_ARGS, 1,024 Opus streams ROUNDS times
streams() {
  local dir=$1 name=$2 rounds=$3 k; shift 3
  [ -f /tmp/ck-0.6b/config.json ] || tg checkpoint create /tmp/ck-0.6b --preset 0.6b --variant custom_voice | tail -1
  start_in "$dir" "$name" 8081 TALKGATE_CACHE=/tmp/tgc -- --model /tmp/ck-0.6b --max-connections 2048 "$@"
  sizing "$name"
  for k in $(seq "$rounds"); do
    load 8081 "$name-c1024-$k" --protocol native --encoding opus --concurrency 1024 --max-in-flight 1024 --duration 20 \
      --ramp 2 --processes 8 --ttfa-limit-ms 150 --bucket medium
    python3 -m bench.stalls "$res/$name-c1024-$k/requests.json" > "$res/$name-c1024-$k-stalls.md"
    log "$name-c1024-$k: $(head -1 "$res/$name-c1024-$k-stalls.md")"
    rm -f "$res/$name-c1024-$k/requests.json"      # ~30 MB: the stalls kept instead
  done
  kv "$name"
  stop "$name"
  pack
}
[[ $parts == *" 0.6b "* ]] && streams "$tree" s06 1
# whole slots (the earlier tree in .e2e/before) with the flags of 2026-12-02's clean run
[[ $parts == *" before "* ]] && streams "$tree/.e2e/before" before1024 "${ROUNDS:-2}" \
  --max-contexts 1024 --max-batch 512
if [[ $parts == *" streams "* ]]; then
  streams "$tree" slots1024 "${ROUNDS:-2}" --max-contexts 1024 --max-batch 512
  streams "$tree" slots2048 "${ROUNDS:-2}"
fi
log "done"; pack
