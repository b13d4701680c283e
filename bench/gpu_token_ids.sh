#!/usr/bin/env bash
# Issue 45 item 3: first audio of streamed text sent as text deltas and as token ids (`talkgate bench --token-ids`),
# one 1.7B CustomVoice server (`--max-contexts 64 --max-batch 64`: its graphs captured in seconds), native WebSocket,
# PCM, 20 req/s open loop, 25 tokens a second, for each of LANGS (default "en zh"): text, then ids.
#   setsid bash bench/gpu_token_ids.sh > /tmp/token-ids.out 2>&1 < /dev/null &     # about 5 minutes on a fresh H200
BENCH=${BENCH:-token-ids}
. "$(dirname "$0")/gpu_serve.sh"
checkpoints custom_voice
start server 8081 -- --model /tmp/ck-1.7b-custom_voice --max-contexts 64 --max-batch 64
for lang in ${LANGS:-en zh}; do
  for mode in text ids; do
    extra=(); [ "$mode" = ids ] && extra=(--token-ids)
    load 8081 "$lang-$mode" --protocol native --lang "$lang" --rps 20 --duration 15 --processes 2 "${extra[@]}"
    pack
  done
done
stop server; log "done"; pack
