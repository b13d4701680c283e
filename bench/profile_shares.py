"""Where a process's time went, from a py-spy raw profile (bench/gpu_serve.sh `profile`: `py-spy record -f raw`,
a line a stack, its frames root first, then its count of samples).

    python -m bench.profile_shares FILE.raw [FILE.raw ...] [--top 25]

Per file: the samples, the share of them waiting in the event loop's selector (idle), then the functions by
inclusive share (the samples with the function anywhere on the stack) and by own share (the stack's last frame),
of the busy samples. py-spy samples without pausing the process (--nonblocking), so these are shares, not times.
"""
from __future__ import annotations

import argparse
from collections import Counter

IDLE = ("EpollSelector.select", "select (selectors.py")


def shares(path: str) -> tuple[int, int, Counter, Counter]:
    """(samples, idle samples, inclusive counts, own counts) of the busy samples, by function name."""
    total = idle = 0
    inclusive: Counter = Counter()
    own: Counter = Counter()
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            count = int(n)
            frames = stack.split(";")
            total += count
            if any(frames[-1].startswith(name) for name in IDLE):
                idle += count
                continue
            for name in {fr.split(" (")[0] for fr in frames}:
                inclusive[name] += count
            own[frames[-1].split(" (")[0]] += count
    return total, idle, inclusive, own


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    for path in args.files:
        total, idle, inclusive, own = shares(path)
        busy = max(1, total - idle)
        print(f"## {path}: {total} samples, {100 * idle / max(1, total):.0f}% idle in the selector")
        print("| inclusive % of busy | function | own % of busy | function |\n| --- | --- | --- | --- |")
        rows_in, rows_own = inclusive.most_common(args.top), own.most_common(args.top)
        for i in range(max(len(rows_in), len(rows_own))):
            a = rows_in[i] if i < len(rows_in) else ("", 0)
            b = rows_own[i] if i < len(rows_own) else ("", 0)
            print(f"| {100 * a[1] / busy:.1f} | {a[0]} | {100 * b[1] / busy:.1f} | {b[0]} |")
        print()


if __name__ == "__main__":
    main()
