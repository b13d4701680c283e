"""How long an idle engine thread's host work takes on a new context's path to its first audio, against how long
the thread idled before it and what it did meanwhile (issue 45).

    python -m bench.idle_gap /tmp/ck-1.7b --gaps 10,100,300,1000 --modes sleep,spin,cuda --runs 15 [--json out.json]

At 1 req/s the server's trace has every host stage of the engine thread about half again to twice its cost where
the request came ~80 ms after the one before (the load generator's warm-ups): `scheduled` 0.6 against 0.33 ms,
`launched` 0.55 against 0.38. This drives an engine in-process (as bench/host_path.py does: its own loop, one context
at a time, its open and whole text in one submit) after a gap of G ms spent one of three ways:
  sleep  time.sleep(G): the thread (and, where nothing else runs, its vCPU) idles, as an idle engine process's does;
  spin   a Python busy loop for G: the core kept busy, the engine's own code and CUDA untouched;
  cuda   sleeps of WARM_MS, each followed by one small CUDA operation and a synchronize: the driver's launch path
         and the GPU kept busy now and then, the thread idle in between.
Per (gap, mode): the median and p90 of submit -> first AudioChunk and of its host parts (open_slots, schedule,
launch) and GPU waits (codes, pcm), ms.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import torch

from bench.host_path import driven_engine, one_context, timed

WARM_MS = 20


def spend(gap_s: float, mode: str, buf: torch.Tensor | None) -> None:
    """The gap before the next context, spent as `mode` says (module doc)."""
    end = time.perf_counter() + gap_s
    if mode == "sleep":
        time.sleep(gap_s)
    elif mode == "spin":
        while time.perf_counter() < end:
            pass
    elif mode == "cuda":
        while (left := end - time.perf_counter()) > 0:
            time.sleep(min(left, WARM_MS / 1000))
            if buf is not None:
                buf.add_(1)
                torch.cuda.current_stream().synchronize()
    else:
        raise ValueError(f"unknown mode {mode!r}")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--gaps", default="10,100,300,1000", help="ms the thread idles before each context")
    ap.add_argument("--modes", default="sleep,spin,cuda")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model's functions (as serve does)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    engine, client, got, ids, parts = driven_engine(args.checkpoint, args.compile)
    r = engine.runner
    timed(parts, "open_slots", r, "open_slots")
    timed(parts, "schedule", engine.scheduler, "schedule")
    timed(parts, "launch", r, "launch")
    timed(parts, "wait_codes", r, "codes_of")
    timed(parts, "wait_pcm", r, "audio_of")
    buf = torch.zeros(1, device="cuda") if torch.cuda.is_available() else None
    ctx, table = 100, []
    for gap in (float(g) for g in args.gaps.split(",")):
        for mode in args.modes.split(","):
            rows = []
            for _ in range(args.runs):
                spend(gap / 1000, mode, buf)
                rows.append(one_context(engine, client, got, ctx, ids, parts))
                ctx += 1
            cell = {"gap_ms": gap, "mode": mode}
            for k in rows[0]:
                values = [row.get(k, 0.0) for row in rows]
                cell[k] = [round(statistics.median(values), 3), round(pct(values, 0.9), 3)]
            table.append(cell)
            print(json.dumps(cell), flush=True)
    keys = [k for k in table[0] if k not in ("gap_ms", "mode")]
    print("\n| gap ms | mode | " + " | ".join(keys) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in keys) + " |")
    for cell in table:
        print(f"| {cell['gap_ms']:g} | {cell['mode']} | "
              + " | ".join(f"{cell[k][0]:.3f} / {cell[k][1]:.3f}" for k in keys) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": args.runs, "warm_ms": WARM_MS, "table": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
