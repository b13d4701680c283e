#!/usr/bin/env bash
# Set up talkgate on a fresh Debian-like machine: system libraries, a virtual environment, the package.
#   scripts/setup.sh          runtime only (libopus, torch, talkgate)
#   scripts/setup.sh --test   plus what the tests need (reference code for parity, Chromium, nginx, client libraries)
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0; [ "${1:-}" = "--test" ] && want_test=1

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
need_pkgs=()
# grep without -q: with pipefail, -q's early exit can kill ldconfig with SIGPIPE and fail the pipeline
ldconfig -p 2>/dev/null | grep 'libopus\.so\.0' >/dev/null || need_pkgs+=(libopus0)
[ $want_test = 1 ] && ! command -v chromium >/dev/null && need_pkgs+=(chromium)
# the proxy in front of replicas in tests/system/test_fleet.py (Envoy comes from PyPI, with the test extra)
[ $want_test = 1 ] && ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ] && need_pkgs+=(nginx)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing ${need_pkgs[*]} with apt-get"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip >/dev/null
# torch 2.13.0 is the CPU build where this machine keeps one on disk; elsewhere pip picks its default build.
python -c "import torch" 2>/dev/null || pip install -q "torch==2.13.0" 2>/dev/null || pip install -q torch
if [ $want_test = 1 ]; then
  pip install -q -e ".[test]"
  # The official reference (for parity tests only): its dependencies first, then the reference itself with
  # --no-deps, last: its torchaudio pin would replace torch, and once it is installed pip reports that unmet
  # pin as a resolver ERROR whenever a later install touches a package it depends on.
  python -c "import qwen_tts" >/dev/null 2>&1 || {    # it prints a flash-attn notice on import
    pip install -q "transformers==5.17.0" "accelerate>=1.0" librosa einops onnxruntime sox
    pip install -q --no-deps "qwen-tts-compat==0.1.1.post1"
  }
else
  pip install -q -e .
fi
echo "setup: done ($(python -c 'import torch; print("torch", torch.__version__)'))"
