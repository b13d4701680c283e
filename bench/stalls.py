"""Where a load run's streams stopped: each request's pauses in its audio (a gap between two received messages of at
least --gap-ms after its first audio), with the time it began in the run and the audio received before it, and the
pauses that began together across requests (within --together-ms): a stall of something their connections share (a
worker's loop, the engine's delivery) rather than of one stream. Also the requests by their number of pauses (a
request whose worker is behind all through its life pauses again and again) and, with --timeline S, every S seconds
of the run the requests receiving audio and those of them in a pause (the count moves in steps of a worker's share of
the streams where whole workers fall behind: docs/benchmarks.md "Low load after last session's changes, and streams
that pause with their worker").

    python -m bench.stalls RUN_DIR/requests.json [--gap-ms 150] [--together-ms 200] [--underruns-only] [--timeline S]
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Pause:
    request: int
    prompt: str
    at_s: float             # when it began, seconds into the run
    ms: float
    after_messages: int     # audio messages received before it


def pauses(requests: list[dict], gap_ms: float, underruns_only: bool = False) -> list[Pause]:
    """Every pause of at least gap_ms in the requests' audio after their first audio, in the order they began."""
    out = []
    for r in requests:
        if r.get("ttfa_ms") is None or r.get("start_s") is None:
            continue
        if underruns_only and not r.get("underruns"):
            continue
        t = r["start_s"] + r["ttfa_ms"] / 1000
        for i, gap in enumerate(r.get("gaps_ms") or []):
            if gap >= gap_ms:
                out.append(Pause(r["idx"], r["prompt_id"], round(t, 3), gap, i + 1))
            t += gap / 1000
    return sorted(out, key=lambda p: p.at_s)


def together(found: list[Pause], within_ms: float) -> list[list[Pause]]:
    """The pauses in groups whose beginnings are within `within_ms` of the group's first."""
    groups: list[list[Pause]] = []
    for p in found:
        if groups and (p.at_s - groups[-1][0].at_s) * 1000 <= within_ms:
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


MOST_PAUSES = 10           # pause_counts' last bucket: this many or more


def pause_counts(requests: list[dict], gap_ms: float, most: int = MOST_PAUSES) -> dict[int, int]:
    """Requests that had audio, by their number of pauses of at least gap_ms (`most` or more counted as `most`)."""
    counts: dict[int, int] = {}
    for r in requests:
        if r.get("ttfa_ms") is None:
            continue
        n = min(most, sum(gap >= gap_ms for gap in r.get("gaps_ms") or []))
        counts[n] = counts.get(n, 0) + 1
    return dict(sorted(counts.items()))


def timeline(requests: list[dict], gap_ms: float, step_s: float) -> list[tuple[float, int, int]]:
    """(t, requests receiving audio at t: from their first audio to their last message, of them in a pause of at
    least gap_ms at t) every step_s seconds of the run."""
    spans, paused = [], []
    for r in requests:
        if r.get("ttfa_ms") is None or r.get("start_s") is None:
            continue
        t = r["start_s"] + r["ttfa_ms"] / 1000
        begin = t
        for gap in r.get("gaps_ms") or []:
            if gap >= gap_ms:
                paused.append((t, t + gap / 1000))
            t += gap / 1000
        spans.append((begin, t))
    if not spans:
        return []
    end = max(b for _, b in spans)
    out, t = [], 0.0
    while t <= end:
        out.append((round(t, 3), sum(a <= t < b for a, b in spans), sum(a <= t < b for a, b in paused)))
        t += step_s
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("requests", help="a talkgate bench run's requests.json")
    ap.add_argument("--gap-ms", type=float, default=150.0)
    ap.add_argument("--together-ms", type=float, default=200.0)
    ap.add_argument("--underruns-only", action="store_true", help="only the requests whose player ran dry")
    ap.add_argument("--timeline", type=float, metavar="S", help="every S seconds: requests receiving audio, in a pause")
    a = ap.parse_args(argv)
    with open(a.requests) as f:
        requests = json.load(f)
    found = pauses(requests, a.gap_ms, a.underruns_only)
    groups = together(found, a.together_ms)
    print(f"{len(found)} pauses of {a.gap_ms:g} ms or more, in {len(groups)} groups "
          f"({sum(len(g) > 1 for g in groups)} of more than one request)")
    dry = [r for r in requests if r.get("underruns")]
    for name, rs in (("requests", requests), ("requests with an underrun", dry)):
        counts = ", ".join(f"{n}{'+' if n == MOST_PAUSES else ''}: {c}" for n, c in pause_counts(rs, a.gap_ms).items())
        print(f"{name} by their pauses: {counts or '-'}")
    if a.timeline:
        print("| s into the run | receiving audio | in a pause |\n| --- | --- | --- |")
        for t, receiving, in_pause in timeline(requests, a.gap_ms, a.timeline):
            print(f"| {t:.2f} | {receiving} | {in_pause} |")
    print("| began (s into the run) | requests | pause ms | audio messages before it |\n| --- | --- | --- | --- |")
    for g in groups:
        ms = [p.ms for p in g]
        print(f"| {g[0].at_s:.2f}-{g[-1].at_s:.2f} | {len(g)} | {min(ms):.0f}-{max(ms):.0f} | "
              f"{', '.join(str(p.after_messages) for p in g)} |")


if __name__ == "__main__":
    main()
