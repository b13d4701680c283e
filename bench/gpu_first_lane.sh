#!/usr/bin/env bash
# Issue 45 on one H200: bench/first_lane.py (a new context's first frame on a high-priority stream beside a running
# step, against waiting for the step) on the 1.7B CustomVoice random-weight checkpoint.
#   setsid bash bench/gpu_first_lane.sh > /tmp/lane.out 2>&1 < /dev/null &
# Results: /tmp/res-lane.tgz (copy it to $OUT from a poll call); progress: $RES/progress.
BENCH=lane
. "$(dirname "$0")/gpu_serve.sh"
export TALKGATE_CACHE=/tmp/tgc-lane
checkpoints custom_voice
log "probe"
timeout 500 python3 -m bench.first_lane /tmp/ck-1.7b-custom_voice --batches "${BATCHES:-32,128,256}" --reps 20 \
  --json "$res/first-lane.json" 2>&1 | grep -v "^\s*$" | tee "$res/first-lane.txt" | grep "^{" >> "$res/progress"
pack
log "done"
