#!/usr/bin/env bash
# Issue 45: first frames decoded ahead of the running rows' past the lane's 64 rows (Runner.launch decode_first,
# synth/engine.py FIRST_DECODE_MAX_ROWS) against the earlier tree (`git archive REV talkgate | tar -x -C
# .e2e/before`) on one H200 in one call (bench/gpu_loads_ab.sh): the engine's GPU tests of it, of the lane and of the
# persistent kernels' yield, then each tree with `talkgate serve` default flags at 100 and 135 req/s (about 80 and
# 100-128 running rows: where it applies) and 20 req/s (where it does not: the lane's), 20 s each.
#   setsid bash bench/gpu_first_decode_ab.sh > /tmp/first-decode-ab.out 2>&1 < /dev/null &
BENCH=first-decode-ab PARTS="tests loads" RATES="100:20:4 135:20:4 20:20:2" LEVELS="" \
  TESTS="tests/gpu/test_persistent.py tests/gpu/test_stream_gate.py tests/gpu/test_engine_gpu.py" \
  K="first_frames_decoded or lane or graphs_equal or persistent or kernel or captured or gate" \
  exec bash "$(dirname "$0")/gpu_loads_ab.sh"
