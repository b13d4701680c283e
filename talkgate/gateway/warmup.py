"""`talkgate warmup`: compile the model's GPU step into the talkgate cache ahead of time, so that a later
`talkgate serve` of the same model on the same kind of GPU starts in seconds (e.g. run it when an image is
built). Everything serve compiles, with the same model, device, dtype and slot flags (synth/compile_cache.py)."""
from __future__ import annotations

import argparse
import os
import time

from talkgate.gateway import serve
from talkgate.synth import compile_cache


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("warmup", help="compile the model's GPU step into the cache ahead of time "
                              "(e.g. when an image is built), so that serve starts in seconds",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", help="checkpoint directory or Hugging Face id (default: serve's built-in "
                   f"random-weight '{serve.DEFAULT_PRESET}' checkpoint)")
    p.add_argument("--device", help="cuda, cpu (default: cuda when available)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="default: bfloat16 on GPU, float32 on CPU")
    p.add_argument("--max-contexts", type=int, help="engine slots, as serve will be given (default: sized from free "
                   "memory); the largest batch's kernels are tuned at this size")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from talkgate.synth.engine import Engine

    t0 = time.perf_counter()
    engine = Engine.from_pretrained(args.model or str(serve.default_checkpoint()), device=args.device,
                                    dtype=args.dtype, max_contexts=args.max_contexts)
    runner = engine.runner
    if runner.device.type != "cuda":
        print(f"talkgate: {runner.device.type}: nothing is compiled or captured on this device; nothing to do")
        return 0
    loaded = time.perf_counter()
    runner.warmup()
    print(f"talkgate: warm-up of {engine.info.name} ({engine.info.size}, {runner.num_slots} slots) done in "
          f"{time.perf_counter() - loaded:.1f} s after a {loaded - t0:.1f} s load, {len(runner.graphs)} graphs; "
          "compile cache: " + ", ".join(f"{var}={os.environ.get(var)}" for var in compile_cache.ENV))
    return 0
