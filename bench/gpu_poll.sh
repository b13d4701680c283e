#!/usr/bin/env bash
# On the GPU machine, after a bench script was started detached (`BENCH=NAME setsid bash bench/gpu_loads_ab.sh >
# /tmp/la.out 2>&1 < /dev/null &`): wait until /tmp/res-NAME/progress says done or SECONDS pass, copying the archive
# that the script packs after each part ($res.tgz, gpu_serve.sh `pack`) to $OUT as it grows, so that a call cut at its
# limit brings back what was measured, or until the script's process ($res/pid, gpu_serve.sh) has ended without saying
# done (its GPU tests failed, its setup did); then print the progress and the end of /tmp/la.out. A machine goes back
# about 30 s after a call, so a run must end inside the call that started it (setup, a server ready and its graphs
# take about 130 s on a fresh H200).
#   bash bench/gpu_poll.sh SECONDS NAME
end=$((SECONDS + $1)) name=$2 res=/tmp/res-$2 out=${OUT:-/tmp}
copy() { [ -f "$res.tgz" ] && cp "$res.tgz" "$out/.copy.tgz" && mv -f "$out/.copy.tgz" "$out/res-$name.tgz"; }
while [ $SECONDS -lt "$end" ]; do
  copy
  grep -q "] done" "$res/progress" 2>/dev/null && break
  sleep 10                  # first: the script, started just before, has replaced an earlier run's $res by then
  [ -f "$res/pid" ] && ! kill -0 "$(cat "$res/pid")" 2>/dev/null && break
done
sleep 2                                         # the script logs done, then packs once more
copy
cat "$res/progress" 2>/dev/null
tail -5 /tmp/la.out 2>/dev/null
