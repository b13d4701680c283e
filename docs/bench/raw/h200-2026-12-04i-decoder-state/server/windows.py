"""Requests in flight at the middle of each 5-s window of a run (from requests.json: start_s, e2e_ms), the requests
started in it, their first-audio p95 and e2e p50."""
import json
import sys

rows = json.load(open(sys.argv[1]))
spans = [(r["start_s"], r["start_s"] + r["e2e_ms"] / 1000, r) for r in rows if r["e2e_ms"]]
for w in range(0, 45, 5):
    t = w + 2.5
    started = [r for s, _, r in spans if w <= s < w + 5]
    if not started:
        continue
    ttfa = sorted(r["ttfa_ms"] for r in started if r["ttfa_ms"] is not None)
    e2e = sorted(r["e2e_ms"] for r in started)
    print(f"{w:2d}-{w + 5:2d} s: in flight at {t:4.1f} s {sum(1 for s, e, _ in spans if s <= t < e):5d}, started "
          f"{len(started):5d}, first audio p95 {ttfa[int(0.95 * len(ttfa)) - 1]:6.1f} ms, e2e p50 {e2e[len(e2e) // 2] / 1000:5.2f} s")
