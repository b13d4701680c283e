#!/usr/bin/env bash
# The residual units' Triton kernels (synth/conv_kernel.py, issue 44) on a GPU machine: their tests compiled, each
# tile configuration at the released decoder's unit shapes against cuDNN (bench/conv_tiles.py), then the decoder's
# step with and without them, compiled as the engine compiles it, with their drift from exact float32
# (bench/decoder.py). About 8 minutes:
#   bash bench/gpu_conv.sh [results folder, default $OUT or /tmp/out]
# Setup: bench/gpu_env.sh. Results: <folder>/tests.txt, tiles.md, decoder.md.
set -uo pipefail
out=${1:-${OUT:-/tmp/out}}
mkdir -p "$out"
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/versions.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/versions.txt"
log tests
timeout 300 python3 -m pytest -q -p no:cacheprovider -p no:hypothesispytest tests/gpu/test_conv_kernel.py \
  tests/gpu/test_window_attention.py 2>&1 | tail -15 | tee "$out/tests.txt"
log tiles
timeout 400 python3 -m bench.conv_tiles 2>&1 | tee "$out/tiles.md"
log decoder
timeout 900 python3 -m bench.decoder --engine-compile --precisions fp16 --batches 1,64,256,512 \
  --unit-kernels off,on 2>&1 | grep -v Warn | tee "$out/decoder.md"
log done
