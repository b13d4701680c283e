"""The server's stage budget of an open-loop run's first audios, split by whether another request of the run was in
flight when each began (issue 45): a request alone finds the engine idle and goes through a step of its own; one
that begins during another's audio meets a running engine (the lane, or the next step). The load generator's summary
gives the client's first audio so split ("while another was streaming", loadgen.load.during_another: the same rule);
this adds where each group's time went.
At 1 req/s on an H200 (2026-12-04) the requests alone set the p95, not those that met another's.

    python -m bench.first_audio_alone RESULTS_DIR [--trace TRACE.jsonl --skip 4]

RESULTS_DIR is a `talkgate bench --out` folder (its requests.json: each request's start and end as the client saw
them). With --trace, the server's `--trace-latency` file: the run's traces are the `--skip` earliest (the load
generator's warm-ups where the file began with the run) then one per request, in order of arrival; each group's
stage budget is printed (bench.latency_trace) beside the client's figures. A trace that does not keep the client's
start to within 50 ms of a fixed offset is refused: the file does not hold this run where --skip says.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from talkgate.loadgen.load import during_another
from talkgate.loadgen.measure import percentile

from bench.latency_trace import read_traces, table

ALIGN_S = 0.05


def aligned(requests: list[dict], traces: list[dict]) -> bool:
    """Whether each trace's read stamp sits at one offset from its request's start (to within ALIGN_S)."""
    offsets = [t["stages"]["read"] / 1e9 - r["start_s"] for r, t in zip(requests, traces)]
    return max(offsets) - min(offsets) <= ALIGN_S


def summary(name: str, ttfa: list[float]) -> str:
    return (f"{name}: {len(ttfa)} requests, first audio p50 {percentile(ttfa, 50):.2f} ms, "
            f"p95 {percentile(ttfa, 95):.2f} ms, max {max(ttfa):.2f} ms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--trace", type=Path)
    ap.add_argument("--skip", type=int, default=4, help="traces before the run's first request (its warm-ups)")
    args = ap.parse_args(argv)
    requests = [r for r in json.loads((args.results / "requests.json").read_text()) if r.get("error") is None
                and r.get("ttfa_ms") is not None]
    if not requests:
        print(f"{args.results}: no request with a first audio", file=sys.stderr)
        return 1
    requests.sort(key=lambda r: r["start_s"])
    traces = None
    if args.trace is not None:
        traces = sorted(read_traces(str(args.trace)), key=lambda t: t["stages"]["read"])
        traces = traces[args.skip:args.skip + len(requests)]
        if len(traces) < len(requests) or not aligned(requests, traces):
            print(f"{args.trace}: its traces after the first {args.skip} are not this run's requests", file=sys.stderr)
            return 1
    flags = during_another([(r["start_s"], r["e2e_ms"]) for r in requests])
    print(summary("all", [r["ttfa_ms"] for r in requests]))
    for name, want in (("alone (no other request in flight)", False), ("during another's audio", True)):
        group = [i for i, f in enumerate(flags) if f == want]
        if not group:
            print(f"{name}: none")
            continue
        print(summary(name, [requests[i]["ttfa_ms"] for i in group]))
        if traces is not None:
            print(table([traces[i] for i in group]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
