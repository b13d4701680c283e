#!/usr/bin/env bash
# Issues 46, 44 and 45 on a 2-GPU machine, after bench/gpu_multi.sh (whose compile cache /tmp/tgc it reuses for the
# 1.7B CustomVoice checkpoint at 512 slots), the two GPUs at once:
#   GPU 0 (issue 46, then 45): 1.7B CustomVoice + 1.7B Base + 1.7B VoiceDesign in one `talkgate serve` from a fresh
#         compile cache (the time until ready); a cloned voice uploaded; a mixed open-loop load, a third each
#         (CustomVoice's default voice, the cloned voice, a designed voice from instructions), OpenAI HTTP PCM,
#         English medium texts, 60 req/s in all; then a one-model server (CustomVoice alone, warm) at 20 req/s, the
#         figure to compare with, and at 1 req/s, both with --trace-latency (issue 45's budget per stage).
#   GPU 1 (issue 44): 1.7B CustomVoice, the codec decoder in float32 (default) against float16: an OpenAI HTTP PCM
#         sweep of English medium texts, one engine, 512 slots each (FP16_WARMUP=1 gpu_multi.sh warms the fp16 decoder).
# Results: $OUT/models.tgz; progress: $RES/progress. Detached as gpu_multi.sh:
#   setsid bash bench/gpu_models.sh > /tmp/models.out 2>&1 < /dev/null &
BENCH=models
. "$(dirname "$0")/gpu_serve.sh"
checkpoints custom_voice base voice_design
[ -f /tmp/ck-1.7b/config.json ] || tg checkpoint create /tmp/ck-1.7b --preset 1.7b --variant custom_voice | tail -1
http() {    # http PORT DIR ARGS...: an OpenAI HTTP PCM load
  local port=$1 dir=$2; shift 2
  load "$port" "$dir" --protocol openai --lang en --processes 2 "$@"
}

gpu0() {
  start three 8081 CUDA_VISIBLE_DEVICES=0 TALKGATE_CACHE=/tmp/tgc-three -- --model cv=/tmp/ck-1.7b-custom_voice \
    --model clone=/tmp/ck-1.7b-base --model design=/tmp/ck-1.7b-voice_design --max-contexts 192
  clone_voice 8081 speaker1
  log "three models: 3 x 20 req/s for 30 s"
  local loaders=()
  http 8081 three-cv --rps 20 --duration 30 --model cv & loaders+=($!)
  http 8081 three-clone --rps 20 --duration 30 --model clone --voice speaker1 & loaders+=($!)
  http 8081 three-design --rps 20 --duration 30 --model design \
    --instructions "A warm, calm female voice, middle-aged, speaking slowly and clearly." & loaders+=($!)
  wait "${loaders[@]}"          # the loaders only: a bare wait would wait for the server too
  curl -s http://127.0.0.1:8081/metrics > "$res/three-metrics.txt"
  stop three
  start one 8081 CUDA_VISIBLE_DEVICES=0 TALKGATE_CACHE=/tmp/tgc -- --model /tmp/ck-1.7b --max-contexts 512 \
    --trace-latency "$res/trace-one.jsonl"
  log "one model: 20 req/s for 30 s, then 1 req/s for 40 s"
  http 8081 one-rps20 --rps 20 --duration 30
  cp "$res/trace-one.jsonl" "$res/trace-one-rps20.jsonl"; : > "$res/trace-one.jsonl"
  http 8081 one-rps1 --rps 1 --duration 40 --processes 1
  stop one
  cp "$res/trace-one.jsonl" "$res/trace-one-rps1.jsonl"
  for r in rps20 rps1; do python3 -m bench.latency_trace "$res/trace-one-$r.jsonl" > "$res/budget-$r.txt" 2>&1; done
  log "gpu0 done"
}

gpu1() {
  log "fp16 decoder: warm-up (quick when gpu_multi.sh made it)"
  TALKGATE_CACHE=/tmp/tgc tg warmup --model /tmp/ck-1.7b --max-contexts 512 \
    --decoder-dtype float16 > "$res/warmup-fp16.log" 2>&1
  log "fp16 decoder: $(tail -1 "$res/warmup-fp16.log" | cut -c1-160)"
  for dd in float32 float16; do
    start dec-$dd 8082 TALKGATE_CACHE=/tmp/tgc -- --model /tmp/ck-1.7b --max-contexts 512 \
      --decoder-dtype $dd
    log "decoder $dd: openai sweep"
    http 8082 sweep-$dd --sweep "${LEVELS:-140,155,170,185,200}" --duration 10 --ttfa-limit-ms 100 --processes 4 \
      --max-in-flight 4096
    curl -s http://127.0.0.1:8082/metrics > "$res/sweep-$dd-metrics.txt"
    stop dec-$dd
  done
  log "gpu1 done"
}
gpu0 &
( export CUDA_VISIBLE_DEVICES=1; gpu1 ) &           # its warm-up and servers see GPU 1 alone
wait
tar czf "$out/models.tgz" -C "$(dirname "$res")" "$(basename "$res")"
log "done"
