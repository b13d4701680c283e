#!/usr/bin/env bash
# Issue 45: an idle engine touching its GPU every 20 ms (`serve --keep-warm`, synth/api.py KEEP_WARM_S) against never
# (`--keep-warm 0`), one H200, one call. 1.7B CustomVoice, `talkgate serve` default flags otherwise and
# --trace-latency, each served in turn (off first: it fills the compile cache both use), OpenAI HTTP PCM, English
# medium texts, open loop: 1 req/s for IDLE_S seconds (default 60), then 20 req/s for 15 s. Beside each server: the
# GPU's power and SM clock over 5 s idle before its loads, and the engine's keep_warm_touches from /metrics.
#   setsid bash bench/gpu_keep_warm_ab.sh > /tmp/kw.out 2>&1 < /dev/null &      # about 10 minutes fresh
BENCH=${BENCH:-keep-warm-ab}
. "$(dirname "$0")/gpu_serve.sh"
checkpoints custom_voice
for mode in off on; do
  flag=(); [ "$mode" = off ] && flag=(--keep-warm 0)
  start "$mode" 8081 TALKGATE_CACHE=/tmp/tgc -- --model /tmp/ck-1.7b-custom_voice --trace-latency "$res/trace.jsonl" \
    "${flag[@]}"
  sleep 2
  nvidia-smi --query-gpu=power.draw,clocks.sm,utilization.gpu --format=csv,noheader -lms 500 > "$res/$mode-idle-gpu.txt" &
  smi=$!; sleep 5; kill "$smi"
  log "$mode idle GPU (power, SM clock, use) over 5 s: $(sort "$res/$mode-idle-gpu.txt" | sed -n '1p;$p' | paste -sd'|')"
  traced "$mode-rps1" --protocol openai --lang en --rps 1 --duration "${IDLE_S:-60}" --processes 1
  traced "$mode-rps20" --protocol openai --lang en --rps 20 --duration 15 --processes 2
  curl -s http://127.0.0.1:8081/metrics | grep -iE "keep_warm|^talkgate_engine_step_seconds_(sum|count)" \
    | tee "$res/$mode-metrics.txt" | sed "s/^/$mode /" | tee -a "$res/progress"
  stop "$mode"
  pack
done
log "done"; pack
