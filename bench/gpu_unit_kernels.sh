#!/usr/bin/env bash
# Issue 44 on one H200, one call series: the codec decoder's residual units as Triton kernels (synth/conv_kernel.py,
# steps of up to codec_decoder.UNIT_KERNEL_MAX_ROWS rows, float16 decoder) against the earlier tree (a
# `git archive REV talkgate` in .e2e/before, carried): each tree in turn (the earlier first) serves one 1.7B
# CustomVoice model with `--decoder-dtype float16` and --trace-latency, under OpenAI HTTP PCM loads at RATES
# (default "1 20 100" req/s). Results: /tmp/res-units.tgz (copy it to $OUT from a poll call); progress:
# $RES/progress.
#   git archive REV talkgate | tar -x -C .e2e/before
#   setsid bash bench/gpu_unit_kernels.sh > /tmp/units.out 2>&1 < /dev/null &
BENCH=units
. "$(dirname "$0")/gpu_serve.sh"
before=$tree/.e2e/before
LOAD_TIMEOUT_S=200
pack() { tar czf "$res.tgz" -C "$(dirname "$res")" "$(basename "$res")"; }
gone() { for _ in $(seq 120); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.5; done; }
checkpoints custom_voice
for which in before after; do
  dir=$tree; [ $which = before ] && dir=$before
  export TALKGATE_CACHE=/tmp/tgc-units-$which
  (cd "$dir" && export PYTHONPATH=$dir:/tmp/site && start "$which" 8081 -- --model /tmp/ck-1.7b-custom_voice \
    --decoder-dtype float16 --trace-latency "$res/trace.jsonl")
  for rate in ${RATES:-1 20 100}; do
    : > "$res/trace.jsonl"
    case $rate in 1) procs=1; secs=30 ;; 20) procs=2; secs=30 ;; *) procs=4; secs=20 ;; esac
    load 8081 "$which-rps$rate" --protocol openai --lang en --rps "$rate" --duration $secs --processes $procs
    cp "$res/trace.jsonl" "$res/trace-$which-rps$rate.jsonl"
    python3 -m bench.latency_trace "$res/trace-$which-rps$rate.jsonl" > "$res/budget-$which-rps$rate.txt" 2>&1
    curl -s http://127.0.0.1:8081/metrics | grep -E "^talkgate_engine_step_seconds_(sum|count)" \
      | sed "s/^/$which-rps$rate /" | tee -a "$res/progress"
  done
  kill -TERM "$(cat "$res/$which.pid")"; gone "$(cat "$res/$which.pid")"
  pack
done
log "done"
