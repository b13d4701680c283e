#!/usr/bin/env bash
# Inductor settings given as environment variables (INDUCTOR_ENV, default TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1:
# each generated pointwise and reduction kernel's block sizes and warps benchmarked at compile time, as gpt-fast
# compiles) against Inductor's defaults, in one call: the 1.7B step's three graphs at ROWS rows (default 256) kernel by
# kernel (bench/decoder_kernels.py), plain, with each setting (a compile cache of its own; settings apart by ';', the
# listings kernels-tuned-1.txt, -2 ...), then plain again (the drift between runs). Other settings, say
# `INDUCTOR_ENV="TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1;TORCH_BLAS_PREFER_CUBLASLT=1"` (Triton multiply templates with
# pointwise epilogues fused, benchmarked against cuBLAS at compile time; cuBLASLt for every multiply).
#   BENCH=inductor-ab setsid bash bench/gpu_inductor_ab.sh > /tmp/la.out 2>&1 < /dev/null &
#   bash bench/gpu_poll.sh 560 inductor-ab
BENCH=${BENCH:-inductor-ab}
. "$(dirname "$0")/gpu_serve.sh"
checkpoints custom_voice
rows=${ROWS:-256}
graphs() {  # NAME CACHE [VAR=VALUE ...]: the listing of each graph, the setup's seconds with it
  local name=$1 cache=$2 t0=$SECONDS; shift 2
  env TALKGATE_CACHE="$cache" "$@" timeout 420 python3 -m bench.decoder_kernels /tmp/ck-1.7b-custom_voice "$res" "$rows" \
    talker,codes,decode > "$res/kernels-$name.txt" 2>&1
  rm -f "$res"/*_trace.json
  log "$name, $((SECONDS - t0)) s: $(grep 'warm-up\|graph B=' "$res/kernels-$name.txt" | tr '\n' ';')"
  pack
}
settings=${INDUCTOR_ENV:-TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1}
graphs plain /tmp/tgc-plain
IFS=';' read -ra each <<< "$settings"
for i in "${!each[@]}"; do
  log "tuned-$((i + 1)): ${each[$i]}"
  # a cache per setting: talkgate's saved compiled functions are keyed by its code, not by Inductor's settings
  # shellcheck disable=SC2086
  graphs "tuned-$((i + 1))" "/tmp/tgc-$(md5sum <<< "${each[$i]}" | cut -c1-8)" ${each[$i]}
done
graphs plain-again /tmp/tgc-plain
log done
