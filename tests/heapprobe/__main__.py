"""What grew in each process between two heap probes (tests/heapprobe/sitecustomize.py):

    python -m tests.heapprobe DIR [--top 15]      # first snapshot after the warm-up against the last, per process

Prints, per process, the heap figures of every probe (VmRSS, glibc's in-use and free heap, what tracemalloc traces)
and the allocation sites whose live memory grew most from the first snapshot to the last, with their tracebacks."""
from __future__ import annotations

import argparse
import json
import tracemalloc
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.heapprobe")
    ap.add_argument("dir", type=Path)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--first", type=int, default=1, help="the probe to compare from (0 starts tracing)")
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in open(args.dir / "heap.jsonl")]
    procs: dict[str, list[dict]] = {}
    for r in rows:
        procs.setdefault(r["name"].rsplit("-", 1)[0], []).append(r)
    t0 = rows[0]["t"]
    for proc, rs in sorted(procs.items()):
        print(f"== {proc}")
        print("   s      VmRSS MB  in use MB  free MB  mmap MB  traced MB  gc objects")
        for r in rs:
            print(f"   {r['t'] - t0:5.0f}  {r['rss_mb']:8.2f}  {r.get('uordblks', 0) / 2**20:9.2f}  "
                  f"{r.get('fordblks', 0) / 2**20:7.2f}  {r.get('hblkhd', 0) / 2**20:7.2f}  {r['traced'] / 2**20:9.3f}"
                  f"  {r['gc_objects']:10d}")
        if len(rs) <= args.first:
            continue
        a = tracemalloc.Snapshot.load(str(args.dir / (rs[args.first]["name"] + ".snap")))
        b = tracemalloc.Snapshot.load(str(args.dir / (rs[-1]["name"] + ".snap")))
        stats = b.compare_to(a, "traceback")
        print(f"   traced: {sum(s.size for s in stats) / 2**20:.3f} MB live, "
              f"{sum(s.size_diff for s in stats) / 2**10:+.1f} KiB from probe {args.first} to {len(rs) - 1}")
        for s in stats[: args.top]:
            if s.size_diff <= 0:
                break
            print(f"   {s.size_diff / 1024:+9.1f} KiB {s.count_diff:+7d} blocks (live {s.size / 1024:.1f} KiB)")
            for line in s.traceback.format(limit=6, most_recent_first=True):
                print("        " + line.strip())


if __name__ == "__main__":
    main()
