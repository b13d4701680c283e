#!/usr/bin/env bash
# Issue 45's figures at `talkgate serve` default flags, traced (--trace-latency), one H200, in one call:
#   1. 1.7B CustomVoice: HTTP PCM at 1 req/s with `nvidia-smi dmon` beside it (the SM clock between requests), native
#      Opus (whole text) at 1 req/s, HTTP PCM and native Opus at 20 req/s; every 1-req/s load (here and in 3) runs
#      RPS1_S seconds (default 60; ~300 for a p95 over ~300 requests);
#   2. streamed text at 25 tokens/s as text deltas and as token ids (`--token-ids`), native PCM: en and zh at 20
#      req/s, en at 100 req/s, en ids over Opus at 20 req/s; then bench.streamed_first_audio (one context at a
#      time: zh and ja without punctuation against en, by character, token and token id);
#   3. 1.7B Base, a voice cloned from a made-up 6 s sample: HTTP PCM at 1 and 20 req/s.
# Each traced load keeps its requests' traces (trace-NAME.jsonl) and stage budget (budget-NAME.txt).
# PARTS (default "fixed streamed clone"): which of 1-3 run, and rps100 (HTTP PCM at 100 req/s for 20 s, after 1's
# loads); ONE_AT_A_TIME=0: part 2 without its Opus ids load and bench.streamed_first_audio; STREAMED (default
# "en:20:2 zh:20:2 en:100:4", LANG:RPS:CLIENT_PROCESSES each): part 2's loads; FIRST_TOKEN_DELAY_MS (default 0):
# part 2's first delta that long after the context starts (an LLM's first token comes after the turn begins),
# its loads named ...-delayN.
#   setsid bash bench/gpu_first_audio_figures.sh > /tmp/fa.out 2>&1 < /dev/null &     # about 12 minutes fresh
BENCH=${BENCH:-first-audio}
. "$(dirname "$0")/gpu_serve.sh"
parts=" ${PARTS:-fixed streamed clone} "
rps1_s=${RPS1_S:-60}
delay=${FIRST_TOKEN_DELAY_MS:-0}; tag=""; [ "$delay" != 0 ] && tag=-delay$delay
if [[ $parts == *" fixed "* || $parts == *" rps100 "* || $parts == *" streamed "* ]]; then
checkpoints custom_voice
start cv 8081 -- --model /tmp/ck-1.7b-custom_voice --trace-latency "$res/trace.jsonl"
if [[ $parts == *" fixed "* ]]; then
nvidia-smi dmon -s pc -d 1 > "$res/dmon-rps1.txt" 2>&1 & dmon=$!
traced http-rps1 --protocol openai --lang en --rps 1 --duration "$rps1_s" --processes 1
kill "$dmon"
traced opus-rps1 --protocol native --encoding opus --tokens-per-second 0 --lang en --rps 1 --duration "$rps1_s" \
  --processes 1
traced http-rps20 --protocol openai --lang en --rps 20 --duration 15 --processes 2
traced opus-rps20 --protocol native --encoding opus --tokens-per-second 0 --lang en --rps 20 --duration 15 \
  --processes 2
pack
fi
if [[ $parts == *" rps100 "* ]]; then
traced http-rps100 --protocol openai --lang en --rps 100 --duration 20 --processes 4
pack
fi
if [[ $parts == *" streamed "* ]]; then
for run in ${STREAMED:-en:20:2 zh:20:2 en:100:4}; do
  IFS=: read -r lang rps processes <<< "$run"
  for mode in text ids; do
    extra=(); [ "$mode" = ids ] && extra=(--token-ids)
    traced "$lang-$mode-rps$rps$tag" --protocol native --lang "$lang" --rps "$rps" --duration 15 \
      --processes "$processes" --first-token-delay-ms "$delay" "${extra[@]}"
  done
  pack
done
[ "${ONE_AT_A_TIME:-1}" = 1 ] && {
traced "en-ids-opus-rps20$tag" --protocol native --encoding opus --lang en --rps 20 --duration 15 --processes 2 \
  --first-token-delay-ms "$delay" --token-ids
timeout 240 python3 -m bench.streamed_first_audio --url ws://127.0.0.1:8081 --runs 2 --start-gap-ms 50 \
  > "$res/streamed-first-audio.md" 2>&1
tee -a "$res/progress" < "$res/streamed-first-audio.md"
}
fi
stop cv
pack
fi
if [[ $parts == *" clone "* ]]; then
checkpoints base
start base 8081 -- --model /tmp/ck-1.7b-base --trace-latency "$res/trace.jsonl" --voice-store /tmp/voices-fa
clone_voice 8081 speaker1
traced clone-rps1 --protocol openai --lang en --rps 1 --duration "$rps1_s" --processes 1 --voice speaker1
traced clone-rps20 --protocol openai --lang en --rps 20 --duration 15 --processes 2 --voice speaker1
stop base
fi
log "done"; pack
