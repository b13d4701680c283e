#!/usr/bin/env bash
# Issue 45 on one H200, one call: new contexts launched behind the running rows' launch while it runs (the engine
# process reads its socket meanwhile: synth/engine.py _launch_behind) against the earlier tree (a
# `git archive REV talkgate` in .e2e/before, carried): each tree in turn (the earlier first) serves one 1.7B
# CustomVoice model, default flags, --trace-latency, under OpenAI HTTP PCM at RATES (default "20") req/s for
# SECONDS (default 20). Results: /tmp/res-behind.tgz after each tree; progress: $RES/progress.
#   git archive REV talkgate | tar -x -C .e2e/before
#   setsid bash bench/gpu_behind.sh > /tmp/behind.out 2>&1 < /dev/null &
BENCH=behind
. "$(dirname "$0")/gpu_serve.sh"
before=$tree/.e2e/before
export TALKGATE_CACHE=/tmp/tgc-behind
pack() { tar czf "$res.tgz" -C "$(dirname "$res")" "$(basename "$res")"; }
gone() { for _ in $(seq 120); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.5; done; }
checkpoints custom_voice
for which in before after; do
  dir=$tree; [ $which = before ] && dir=$before
  (cd "$dir" && export PYTHONPATH=$dir:/tmp/site && start "$which" 8081 -- --model /tmp/ck-1.7b-custom_voice \
    --trace-latency "$res/trace.jsonl")
  for rate in ${RATES:-20}; do
    : > "$res/trace.jsonl"
    load 8081 "$which-rps$rate" --protocol openai --lang en --rps "$rate" --duration "${SECONDS_EACH:-20}" --processes 2
    cp "$res/trace.jsonl" "$res/trace-$which-rps$rate.jsonl"
    python3 -m bench.latency_trace "$res/trace-$which-rps$rate.jsonl" > "$res/budget-$which-rps$rate.txt" 2>&1
    curl -s http://127.0.0.1:8081/metrics | grep -E "^talkgate_engine_step_seconds_(sum|count)" \
      | sed "s/^/$which-rps$rate /" | tee -a "$res/progress"
  done
  kill -TERM "$(cat "$res/$which.pid")"; gone "$(cat "$res/$which.pid")"
  pack
done
log "done"
