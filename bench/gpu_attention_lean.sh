#!/usr/bin/env bash
# Issue 44: the one-token attention's softmax step one query at a time (docs/experiments/attention-lean.patch) against
# the engine's, on one GPU. PARTS (default "variants tests roofline"; in this order):
#   variants  bench/attention_variants.py at VARIANT_ROWS rows (default 1,64,256,512): the kernel, the lean and the
#             tensor-core variants alone (about 2 minutes)
#   tests     the patch applied to this tree (left so: the next call re-syncs it), the GPU tests of every kernel that
#             takes the step (one-token, window and short attention, the persistent kernels; about 2 minutes)
#   roofline  each tree's step by part at ROOF_BATCHES rows (default 1,8,64,256,512): bench/gpu_loads_ab.sh's part,
#             HEAD's talkgate and bench (git archive into .e2e/before) before the patched tree (about 2 minutes a tree)
# Setup takes 1-2 minutes on a fresh machine (SETUP=0 on one this session already set up), so a call of 600 s holds
# `variants tests` or `roofline`, not all three:
#   PARTS=variants setsid bash bench/gpu_attention_lean.sh > /tmp/al.out 2>&1 < /dev/null &
#   bash bench/gpu_poll.sh 570 attention-lean      # in the same device call
# (.e2e/ and .whl/, carried: bench/gpu_wheels.sh)
BENCH=${BENCH:-attention-lean}
. "$(dirname "$0")/gpu_serve.sh"
parts=" ${PARTS:-variants tests roofline} "
if [[ $parts == *" variants "* ]]; then
  log "variants"
  timeout 300 python3 -m bench.attention_variants --rows "${VARIANT_ROWS:-1,64,256,512}" > "$res/variants.txt" 2>&1
  tail -3 "$res/variants.txt" | tee -a "$res/progress"
  pack
fi
if [[ $parts =~ " "(tests|roofline)" " ]]; then
  rm -rf .e2e/before && mkdir -p .e2e/before && git archive HEAD talkgate bench | tar -x -C .e2e/before
  git apply docs/experiments/attention-lean.patch || { log "the patch does not apply"; pack; exit 1; }
fi
if [[ $parts == *" tests "* ]]; then
  GPU_TESTS=1 gpu_tests tests/gpu/test_attention.py tests/gpu/test_window_attention.py tests/gpu/test_persistent.py \
    tests/gpu/test_attention_variants.py
fi
if [[ $parts == *" roofline "* ]]; then
  log "roofline"
  RES=$res/roofline BENCH=$BENCH-roofline SETUP=0 PARTS=roofline bash bench/gpu_loads_ab.sh > "$res/roofline.out" 2>&1
  tail -2 "$res/roofline/progress" | tee -a "$res/progress"
fi
log "done"
pack
