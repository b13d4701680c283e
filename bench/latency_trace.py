"""A `talkgate serve --trace-latency PATH` file as a latency budget: per endpoint and served model, p50 and p95 of each
stage (the time from the stage before it), of the whole (read -> written: first audio as the server sees it) and of the
wait for the text that started the first frame (opened -> read: streamed text's wait for its committing delta).

    python -m bench.latency_trace PATH [--endpoint http:/v1/audio/speech] [--model NAME]

Several models' requests (a line's `model`, null for the default) are budgeted apart.

Stages and what each one stamps: talkgate/server/latency_trace.py; the budget: docs/design.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from talkgate.loadgen.measure import percentile
from talkgate.server.latency_trace import STAGES
from talkgate.synth.api import ENGINE_STAGES

PROCESS = {stage: "engine" for stage in ENGINE_STAGES}


def read_traces(path: str) -> list[dict]:
    """The file's traces; a line cut short (the server stopped mid-write) is skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                trace = json.loads(line)
            except ValueError:
                continue
            if isinstance(trace, dict) and set(trace.get("stages", ())) == set(STAGES):
                out.append(trace)
    return out


def budget(traces: list[dict]) -> list[tuple[str, str, float, float]]:
    """(row, process, p50 ms, p95 ms): each stage after the first, then the whole and the text wait."""
    spans: dict[str, list[float]] = defaultdict(list)
    for t in traces:
        s = t["stages"]
        for before, stage in zip(STAGES, STAGES[1:]):
            spans[stage].append((s[stage] - s[before]) / 1e6)
        spans["total: read -> written"].append((s["written"] - s["read"]) / 1e6)
        spans["text wait: opened -> read"].append((s["read"] - t["opened"]) / 1e6)
    return [(row, PROCESS.get(row, "worker" if row in STAGES else "-"), percentile(v, 50), percentile(v, 95))
            for row, v in spans.items()]


def table(traces: list[dict]) -> str:
    lines = ["| stage (time since the one above) | process | p50 ms | p95 ms |", "| --- | --- | --- | --- |"]
    lines += [f"| {row} | {process} | {p50:.3f} | {p95:.3f} |" for row, process, p50, p95 in budget(traces)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path")
    ap.add_argument("--endpoint", help="only this endpoint's requests (as the file names it)")
    ap.add_argument("--model", help="only this served model's requests (as the file names it)")
    args = ap.parse_args(argv)
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)       # (endpoint, model) -> traces
    for t in read_traces(args.path):
        model = t.get("model") or ""            # null (the default), or a file written before lines named it
        if args.endpoint in (None, t["endpoint"]) and args.model in (None, model):
            groups[t["endpoint"], model].append(t)
    if not groups:
        print(f"{args.path}: no complete trace", file=sys.stderr)
        return 1
    for (endpoint, model), traces in sorted(groups.items()):
        name = f"{endpoint} model {model}" if model else endpoint
        print(f"\n{name}: {len(traces)} requests\n{table(traces)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
