#!/usr/bin/env bash
# Issues 44 and 45: the earlier tree (`git archive REV talkgate | tar -x -C .e2e/before`) against this one on one H200
# in one call, at every load the issues name. PARTS (default "tests decode loads streams"; run in this order):
#   tests    GPU tests: TESTS, -k K (default the engine's lane, capture and cuDNN tests)
#   roofline each of ROOF_TREES' (default "before after"; a tree named again, "before after before", runs again with
#            its files named NAME-again: kernels the change does not touch ran 3-7% faster in an H200's second run of
#            one call, 2026-12-06) step by part at ROOF_BATCHES rows (bench/roofline.py, 1.7B;
#            default 1,8,64,256,512; a tree but `after` runs its own bench/ where .e2e/NAME has one: `git archive REV
#            talkgate bench`)
#   decode   each of DECODE_TREES' (default "before after"; named again as ROOF_TREES) decode graph of DECODE_ROWS rows
#            kernel by kernel (bench/decoder_kernels.py; an engine of that many slots); DECODE_GRAPHS: which of the
#            step's graphs (default decode; "talker,codes,decode" all three)
#   loads    each tree with `talkgate serve` default flags, 1.7B CustomVoice, OpenAI HTTP PCM, open loop, English
#            medium texts: RATES (RATE:SECONDS:CLIENT_PROCESSES each; default 1 req/s for 90 s, 20 and 100 req/s for
#            20 s; LOAD_ARGS: more flags of each, e.g. --max-in-flight 4096 past ~150 req/s; packed after each),
#            OPUS_RATES the same way over the native WebSocket, whole text, Opus 48 kHz (default none), then a
#            sweep of LEVELS req/s 10 s a level (LEVELS="" for none); LOAD_TREES (one GPU; default "before after";
#            "after": this tree alone, e.g. a target's figures on main); TWO_GPUS=1 (a machine of two): both trees at
#            once whatever LOAD_TREES says, before on GPU 0 and after on GPU 1, with --trace-latency, each load's
#            trace and stage budget kept (trace-NAME.jsonl, budget-NAME.txt); on one GPU so too with UNTRACED=0
#            (default untraced)
#   streams  each tree serving 0.6B CustomVoice (`--max-contexts` the largest of STREAMS): for each count of STREAMS
#            (default 512; "512 1024" say) that many native Opus 48-kHz streams started over 2 s, medium texts, 14 s,
#            STREAM_RUNS times (default 1; run N with --seed N-1) at each of STREAM_TPS tokens a second (default 25;
#            0: the whole text at once; runs named -tpsN but at 25), a client process a 128 streams; STREAM_LOAD_ARGS:
#            more flags of each (--bucket all --lang all --duration 20: every text); STREAM_TREES (default "before after"):
#            which trees, each but `after` (this one) from .e2e/NAME; each run's pauses by bench/stalls.py; PYSPY=1:
#            one more run (NAME-profiled, not one of the STREAM_RUNS) with py-spy (100 Hz, 8 s, --nonblocking) of the
#            engine process and two workers: a profiled run is not a measurement (on 2026-12-02 its 150-ms pauses
#            were 1,037-1,330 against 59-152 unprofiled, all within py-spy's 8 s);
#            STREAM_SERVE_ARGS: more flags of `talkgate serve` (--max-batch 512 beside 1,024 slots: the graphs of 512);
#            then on the same server STREAMED_TEXT (LANG:RPS each, say "zh:20 en:20"; default none): native PCM, medium
#            texts streamed at 25 tokens a second, open loop, 15 s (first audio of streamed text, as in issue 45)
#   setsid bash bench/gpu_loads_ab.sh > /tmp/la.out 2>&1 < /dev/null &     # about 25 minutes on a fresh H200
#   bash bench/gpu_poll.sh 570 loads-ab         # in the same device call: a run must end inside its call
# (.e2e/ and .whl/, carried: bench/gpu_wheels.sh)
BENCH=${BENCH:-loads-ab}
. "$(dirname "$0")/gpu_serve.sh"
parts=" ${PARTS:-tests decode loads streams} "
# run=NAME, or NAME-again where this part ran NAME already (runs: the names so far, " " at the part's start)
named_run() { run=$1; [[ $runs == *" $1 "* ]] && run=$1-again; runs+="$1 "; }
[[ $parts =~ " "(tests|roofline|decode|loads)" " ]] && checkpoints custom_voice
export TALKGATE_CACHE=${TALKGATE_CACHE:-/tmp/tgc-default}
if [[ $parts == *" tests "* ]]; then
  tests=(tests/gpu/test_engine_gpu.py); [ -f tests/gpu/test_cudnn_search.py ] && tests+=(tests/gpu/test_cudnn_search.py)
  # shellcheck disable=SC2086
  GPU_TESTS=1 gpu_tests ${TESTS:-${tests[*]}} -k "${K:-lane or staged or graphs_equal or cudnn}"
  grep -q " passed" "$res/gpu-tests.txt" && ! grep -q "failed\|error" "$res/gpu-tests.txt" || { log "GPU tests failed"; pack; exit 1; }
fi
if [[ $parts == *" roofline "* ]]; then
  runs=" "
  for which in ${ROOF_TREES:-before after}; do
    dir=$(tree_of $which)
    named_run "$which"
    (cd "$dir" && PYTHONPATH=$dir:$tree:/tmp/site timeout 400 python3 -m bench.roofline /tmp/ck-1.7b-custom_voice \
      --batches "${ROOF_BATCHES:-1,8,64,256,512}" --reps 20 --json "$res/roofline-$run.json" 2>&1 | grep -v Warn \
      > "$res/roofline-$run.md")
    log "$run roofline: $(grep -c '' "$res/roofline-$run.md") lines"
    pack
  done
fi
if [[ $parts == *" decode "* ]]; then
  for B in ${DECODE_ROWS:-64 512}; do
    runs=" "
    for which in ${DECODE_TREES:-before after}; do
      dir=$(tree_of $which)
      named_run "$which"
      (cd "$dir" && PYTHONPATH=$dir:$tree:/tmp/site timeout 300 python3 -m bench.decoder_kernels \
        /tmp/ck-1.7b-custom_voice "$res" "$B" "${DECODE_GRAPHS:-decode}" > "$res/decode-$run-$B.txt" 2>&1)
      rm -f "$res"/*_trace.json
      log "$run: $(grep ' graph B=' "$res/decode-$run-$B.txt" | tr '\n' ' '); on cuDNN's generic kernel: $(grep -c \
implicit_convolve_sgemm "$res/decode-$run-$B.txt") convolutions"
      pack
    done
  done
fi
loads() {
  grep -h "warm-up\|ready\|graphs captured" "$res/$1.log" | cut -c1-300 >> "$res/progress"
  local rate rps seconds processes levels=${LEVELS-190,210,230} port=${PORT:-8081}
  for rate in ${RATES:-1:90:1 20:20:2 100:20:4}; do
    IFS=: read -r rps seconds processes <<< "$rate"
    [ -n "${TRACE_FILE:-}" ] && : > "$TRACE_FILE"
    # shellcheck disable=SC2086
    load "$port" "$1-rps$rps" --protocol openai --lang en --rps "$rps" --duration "$seconds" --processes "$processes" \
      ${LOAD_ARGS:-}
    [ -n "${TRACE_FILE:-}" ] && kept_trace "$1-rps$rps" "$TRACE_FILE"
    pack                                   # each run's files out as soon as it ends: a poll finds them if the machine goes
  done
  for rate in ${OPUS_RATES:-}; do
    IFS=: read -r rps seconds processes <<< "$rate"
    load "$port" "$1-opus-rps$rps" --protocol native --encoding opus --tokens-per-second 0 --lang en --rps "$rps" \
      --duration "$seconds" --processes "$processes"
  done
  [ -n "$levels" ] && load "$port" "$1-sweep" --protocol openai --lang en --sweep "$levels" --duration 10 \
    --ttfa-limit-ms 100 --processes 4 --max-in-flight 4096
  curl -s "http://127.0.0.1:$port/metrics" | grep -E "^talkgate_engine_(lane|first_decodes)" | sed "s/^/$1 /" \
    | tee -a "$res/progress"
}
if [[ $parts == *" loads "* ]]; then
  if [ "${TWO_GPUS:-0}" = 1 ]; then both_trees loads; else UNTRACED=${UNTRACED:-1} each_tree loads; fi
fi
if [[ $parts == *" streams "* ]]; then
  [ -f /tmp/ck-0.6b/config.json ] || tg checkpoint create /tmp/ck-0.6b --preset 0.6b --variant custom_voice | tail -1
  counts=${STREAMS:-512}
  slots=$(tr ' ' '\n' <<< "$counts" | sort -n | tail -1)
  for which in ${STREAM_TREES:-before after}; do
    dir=$(tree_of "$which")
    # shellcheck disable=SC2086
    start_in "$dir" "$which-0.6b" 8081 -- --model /tmp/ck-0.6b --max-contexts "$slots" ${STREAM_SERVE_ARGS:-}
    for streams in $counts; do
      runs=$(seq "${STREAM_RUNS:-1}"); [ "${PYSPY:-0}" = 1 ] && runs="$runs profiled"
      for tps in ${STREAM_TPS:-25}; do
      for run in $runs; do
        name=$which-0.6b-c$streams-$run; [ "$tps" != 25 ] && name=$name-tps$tps
        [ "$run" = profiled ] && { sleep 8; profile "$name"; } &
        seed=0; [ "$run" != profiled ] && seed=$((run - 1))
        # shellcheck disable=SC2086
        load 8081 "$name" --protocol native --encoding opus --concurrency "$streams" --tokens-per-second "$tps" \
          --duration 14 --ramp 2 --processes "$((streams / 128))" --ttfa-limit-ms 150 --seed "$seed" ${STREAM_LOAD_ARGS:-}
        wait
        python3 -m bench.stalls "$res/$name/requests.json" > "$res/$name-stalls.md"
        log "$which run $run of $streams at $tps tokens/s: $(head -1 "$res/$name-stalls.md")"
        pack                               # each run out as it ends: a machine lost mid-part keeps the runs before
      done
      done
    done
    for lang_rps in ${STREAMED_TEXT:-}; do
      IFS=: read -r lang rps <<< "$lang_rps"
      load 8081 "$which-0.6b-$lang-text-rps$rps" --protocol native --lang "$lang" --rps "$rps" --duration 15 --processes 2
    done
    stop "$which-0.6b"
    log "$which-0.6b: $(grep -c 'event loop woke' "$res/$which-0.6b.log") worker loop stalls logged (over 100 ms)"
    pack
  done
fi
log "done"; pack
