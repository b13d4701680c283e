"""The engine thread's host work on a new context's path to its first audio, at batch 1 (issue 45).

    python -m bench.host_path /tmp/ck-1.7b --runs 40 [--json out.json] [--profile]

An engine (its own loop driven here, as the engine process drives it) gets one context at a time on an idle GPU,
its open and its whole text in one submit, as an HTTP request sends them; the loop runs until its first
AudioChunk. Per run, milliseconds of host time in each part until then: submit, applying the commands (open_slots:
the slot's tensors), schedule, the launch (the prefill's host work and, in trees before the prefill graph embedded
the text, Prompts.prefills; the step's graphs), and the waits for the codes and the PCM (those are the GPU's); and
the whole from submit to the first chunk. Also the host time of one replay of each graph a first frame launches and
of one small CUDA operation in a loop (what each launch costs the thread). --profile adds the profiler's tables of
20 opens, of the one-row prefill graph's kernels (GPU) and of one context's life. Results: docs/benchmarks.md "First audio: the engine thread's launches".
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch

from talkgate.synth.api import AudioChunk, ContextParams, EndText, OpenContext
from talkgate.synth.engine import Engine
from talkgate.synth.request import text_seconds

TEXT = "Thanks for calling. Your order shipped this morning and should arrive on Thursday."


def timed(parts: dict, name: str, obj, attr: str) -> None:
    """Wrap obj.attr so that its host time adds to parts[name]."""
    fn = getattr(obj, attr)

    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            parts[name] += (time.perf_counter() - t0) * 1000
    setattr(obj, attr, wrapper)


def one_context(engine: Engine, client: int, got: list, ctx: int, ids: tuple, parts: dict) -> dict:
    """Submit a context with its whole text, run the loop to its first AudioChunk: ms from submit to it, and the
    parts' ms until then; then let the context end."""
    got.clear()
    parts.clear()
    t0 = time.perf_counter()
    engine.submit(client, [OpenContext(ctx, ContextParams(fixed_frames=4)), EndText(ctx, ids, text_seconds(TEXT))])
    while not got:
        engine.run_once()
    row = {"first_chunk_ms": (time.perf_counter() - t0) * 1000, **parts}
    while engine.scheduler.running or engine.scheduler.waiting or engine._commands:
        engine.run_once()
    engine.run_once()
    return row


def driven_engine(checkpoint: str, compile: bool) -> tuple:
    """An engine of 8 slots, warm, with one client whose AudioChunks land in `got`, TEXT's ids, and three contexts
    run (first calls: allocator, caches): (engine, client, got, ids, parts) for one_context."""
    engine = Engine.from_pretrained(checkpoint, max_contexts=8, torch_compile=compile)
    engine.warm_up()
    parts: dict = defaultdict(float)
    got: list = []
    client = engine.connect(lambda events: got.extend(ev for ev in events if isinstance(ev, AudioChunk)))
    ids = tuple(engine.new_tokenizer().tokenizer.encode(TEXT))
    for ctx in range(1, 4):
        one_context(engine, client, got, ctx, ids, parts)
    return engine, client, got, ids, parts


def replay_host_us(r, reps: int = 20) -> dict:
    """Host microseconds of one replay of each graph a batch-1 first frame launches (the GPU idle before each)."""
    out = {}
    for key in [k for k in r.graphs if k[0] == "prefill" and k[1] == 1] + [(p, 1) for p in ("talker", "codes", "decode")]:
        g = r.graphs.get(key)
        if g is None:
            continue
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            g.replay()
            times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        out["@".join(map(str, key))] = round(statistics.median(times), 1)
    return out


def op_cost_us(device: str, reps: int = 200) -> dict:
    """Host microseconds one small CUDA operation costs the calling thread (a launch, queued, not waited for),
    by kind, inside and outside inference mode: what each launch on the first-audio path costs."""
    x, idx, src = (torch.zeros(64, 16, device=device), torch.arange(4, device=device),
                   torch.ones(4, 16, device=device))
    host = torch.zeros(64, pin_memory=True)
    kinds = {"add_": lambda: x.add_(1), "index_fill_": lambda: x.index_fill_(0, idx, 0),
             "index_copy_": lambda: x.index_copy_(0, idx, src), "copy_ pinned": lambda: x[0].copy_(host[:16], non_blocking=True),
             "event record": lambda: torch.cuda.Event().record()}
    out = {}
    for mode in ("plain", "inference"):
        with torch.inference_mode(mode == "inference"):
            for name, fn in kinds.items():
                fn()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                out[f"{name} ({mode})"] = round((time.perf_counter() - t0) * 1e6 / reps, 2)
                torch.cuda.synchronize()
    return out


def profile_opens(engine: Engine, client: int, runs: int = 20) -> str:
    """The profiler's table (self CPU time) of `runs` step boundaries that each open one context (no text: no step)."""
    from torch.profiler import ProfilerActivity, profile

    from talkgate.synth.api import CancelContext
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(runs):
            engine.submit(client, [OpenContext(5000 + i, ContextParams())])
            engine.run_once()
            engine.submit(client, [CancelContext(5000 + i)])
            engine.run_once()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)


def profile_prefill(r, reps: int = 5) -> str | None:
    """The profiler's table (GPU time by kernel) of the one-row prefill graph of the shortest length, the first
    frame's largest GPU part at batch 1; None without it (CPU, no graphs)."""
    from torch.profiler import ProfilerActivity, profile
    g = r.graphs.get(("prefill", 1, r.prefill_lens[0]))
    if g is None:
        return None
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model's functions (as serve does)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    engine, client, got, ids, parts = driven_engine(args.checkpoint, args.compile)
    r = engine.runner
    timed(parts, "submit", engine, "submit")
    timed(parts, "apply_commands", engine, "_apply_commands")
    timed(parts, "open_slots", r, "open_slots")
    timed(parts, "schedule", engine.scheduler, "schedule")
    timed(parts, "launch", r, "launch")
    timed(parts, "prompt_embeddings", r.tts.prompts, "prefills")
    timed(parts, "prefill", r, "_prefill")
    timed(parts, "wait_codes", r, "codes_of")
    timed(parts, "wait_pcm", r, "audio_of")
    rows = []
    for i in range(args.runs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        time.sleep(0.01)
        rows.append(one_context(engine, client, got, 100 + i, ids, parts))
    summary = {k: round(statistics.median(row.get(k, 0.0) for row in rows), 3) for k in rows[0]}
    print("median ms over", args.runs, "runs:", json.dumps(summary), flush=True)
    out = {"summary": summary, "runs": rows, "graphs": len(r.graphs), "replay_host_us": replay_host_us(r)}
    print("graph replays, host us:", json.dumps(out["replay_host_us"]), flush=True)
    if torch.cuda.is_available():
        out["op_cost_us"] = op_cost_us("cuda")
        print("one operation, host us:", json.dumps(out["op_cost_us"]), flush=True)
    if args.profile:
        out["profile_opens"] = profile_opens(engine, client)
        print(out["profile_opens"])
        out["profile_prefill"] = profile_prefill(r)
        print(out["profile_prefill"])
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            one_context(engine, client, got, 999, ids, parts)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        print(table)
        out["profile"] = table
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
