#!/usr/bin/env bash
# Issue 45: what an idle host costs the first audio at 1 req/s. The budget at 1 req/s has every host stage two to
# three times its cost under load (the worker's encode and write 0.24 ms each, the engine thread's open and launch
# 1.2 ms against 0.6 at 20 req/s) and two wake-ups of idle threads (~0.45 ms each); the engine thread spinning alone
# did not speed up its own stages (docs/benchmarks.md, "the engine loop spinning"). The machine is a Firecracker
# microVM whose vCPUs idle through the haltpoll cpuidle driver: a vCPU that halts gives its physical core back to the
# host. This serves 1.7B CustomVoice (`talkgate serve` default flags, --trace-latency) once and runs OpenAI HTTP PCM at
# 1 req/s (IDLE_S seconds, default 45) and 20 req/s (15 s) in rounds: plain, then with a PM QoS request of 0 us held
# on /dev/cpu_dma_latency (what tuned's latency-performance profile does: no vCPU halts, every one polls when idle).
# Beside each load: the vCPUs' busy share (/proc/stat) and each cpuidle state's entries.
#   setsid bash bench/gpu_idle_wakeup.sh > /tmp/idle.out 2>&1 < /dev/null &      # about 9 minutes fresh
BENCH=${BENCH:-idle-wakeup}
. "$(dirname "$0")/gpu_serve.sh"
{ cat /sys/devices/system/cpu/cpuidle/current_driver /sys/devices/system/cpu/cpuidle/current_governor 2>&1
  for s in /sys/devices/system/cpu/cpu0/cpuidle/state*; do
    echo "$s: $(cat "$s/name") latency $(cat "$s/latency") us, residency $(cat "$s/residency") us"; done
  grep -H . /sys/module/haltpoll/parameters/* /sys/module/cpuidle_haltpoll/parameters/* 2>/dev/null
  ls -l /dev/cpu_dma_latency; grep -m1 "model name" /proc/cpuinfo
  grep -H . /sys/devices/system/cpu/cpu0/cpufreq/scaling_{driver,governor,cur_freq} 2>/dev/null; } \
  > "$res/cpuidle.txt" 2>&1
tee -a "$res/progress" < "$res/cpuidle.txt"
idle_counts() { cat /sys/devices/system/cpu/cpu*/cpuidle/state*/usage 2>/dev/null | awk "{s += \$1} END {print s}"; }
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat; }
qos_on() {
  python3 -c 'import os, struct, time
fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY); os.write(fd, struct.pack("i", 0)); time.sleep(1e6)' &
  qos=$!; sleep 0.5
}
measured() {    # measured NAME ARGS...: a traced load with the vCPUs' busy share and the cpuidle entries beside it
  local name=$1 b0 b1 i0 i1; shift
  read -r -a b0 < <(busy); i0=$(idle_counts)
  traced "$name" "$@"
  read -r -a b1 < <(busy); i1=$(idle_counts)
  log "$name: vCPUs busy $(python3 -c "print(round(100 * ($((b1[0] - b0[0]))) / max(1, $((b1[0] + b1[1] - b0[0] - b0[1]))), 1))")%, cpuidle entries $((i1 - i0))"
}
checkpoints custom_voice
start cv 8081 -- --model /tmp/ck-1.7b-custom_voice --trace-latency "$res/trace.jsonl"
for round in ${ROUNDS:-1 2}; do
  for mode in plain qos; do
    qos=""; [ "$mode" = qos ] && qos_on
    measured "$mode-rps1-$round" --protocol openai --lang en --rps 1 --duration "${IDLE_S:-45}" --processes 1
    [ "$round" = 1 ] && measured "$mode-rps20-$round" --protocol openai --lang en --rps 20 --duration 15 --processes 2
    [ -n "$qos" ] && kill "$qos"
    pack
  done
done
stop cv
log "done"; pack
