#!/usr/bin/env bash
# Issue 22's cold-start measurement on a GPU machine, one model per call (each fits a 10-minute call):
#   bench/gpu_coldstart.sh 1.7b      (GPU_TESTS=1: then the GPU test)
# For the model: a random-weight checkpoint; `talkgate serve` with an empty talkgate cache (a fresh
# machine), then again with the cache it filled (a restart): process start -> ready line -> first audio of a
# request sent at ready, the first 20 requests after ready and 20 once it is long warm (bench/coldstart.py).
# IMAGE=1: then `talkgate warmup` into a third, empty cache (an image build) and serve from it.
# GPU_TESTS=1: then tests/gpu/test_engine_gpu.py, in the time left of DEADLINE seconds (default 570).
# Setup: bench/gpu_env.sh. Results: $OUT/cold-<size>/ (one JSON and one server log a run) and the summary printed
# last.
set -uo pipefail
size=${1:?1.7b or 0.6b}
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/out}; res=$out/cold-$size; mkdir -p "$res"
cd "$here"
. bench/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)"
  nproc; } | tee "$res/env.txt"
ck=/tmp/ck-$size
[ -f "$ck/config.json" ] || { log "checkpoint $size"; python3 -m talkgate checkpoint create "$ck" \
  --preset "$size" --variant custom_voice | tail -1; }
cold() {   # label, cache folder
  log "serve: $1"
  TALKGATE_CACHE=$2 python3 -m bench.coldstart --model "$ck" --label "$1" --out "$res/$1.json" \
    --requests 20 --rps 4 --settle "${SETTLE:-10}" 2>&1 | tail -4
  du -sh "$2" 2>/dev/null
}
rm -rf /tmp/tgc-$size /tmp/tgc-img-$size
cold fresh /tmp/tgc-$size
cold restart /tmp/tgc-$size
if [ "${IMAGE:-0}" = 1 ]; then
  log "talkgate warmup into an empty cache (an image build)"
  TALKGATE_CACHE=/tmp/tgc-img-$size python3 -m talkgate warmup \
    --model "$ck" 2>&1 | grep -v " INFO " | tail -3
  cold image /tmp/tgc-img-$size
fi
if [ "${GPU_TESTS:-0}" = 1 ]; then
  left=$(( ${DEADLINE:-570} - SECONDS )); log "GPU tests (${left} s left)"
  [ "$left" -gt 30 ] && timeout "$left" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_engine_gpu.py -k "${TESTS_K:-}" -o log_cli=true --log-cli-level=WARNING 2>&1 | tail -40
fi
python3 - "$res" <<'EOF'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    r = json.loads(f.read_text())
    a, w = r.get("after_ready", {}).get("summary", {}), r.get("long_warm", {}).get("summary", {})
    print(f"{r['label']:8s} ready {r.get('ready_s')} s, first audio {r.get('first_audio_s')} s, all graphs "
          f"{r.get('all_captured_s')} s; p50/p95 TTFA first 20 {a.get('ttfa_p50_ms')}/{a.get('ttfa_p95_ms')} ms, "
          f"long-warm {w.get('ttfa_p50_ms')}/{w.get('ttfa_p95_ms')} ms, errors {a.get('errors')}/{w.get('errors')}")
    for line in r.get("profile", []):
        print("   ", line[-900:])
EOF
log "done"
