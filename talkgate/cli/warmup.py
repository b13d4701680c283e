"""`talkgate warmup`: compile the model's GPU step into the talkgate cache ahead of time, so that a later
`talkgate serve` of the same model on the same kind of GPU starts in seconds (e.g. run it when an image is
built); several --model (serve's [NAME=]DIR), or serve's --models FILE, warm each in turn, each with its own
slots. Everything serve compiles, with the same model, device, dtype and slot flags (synth/compile_cache.py)."""
from __future__ import annotations

import argparse
import logging
import os
import time

from talkgate.cli import args as cli_args
from talkgate.cli import serve
from talkgate.processes import bytecode


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "warmup", help="compile the model's GPU step into the cache ahead of time, so that serve starts in seconds",
        description="Compile everything `talkgate serve` compiles for this model, device, dtype and slot count "
                    "into the talkgate cache ($TALKGATE_CACHE or ~/.cache/talkgate), e.g. when an image is built; "
                    "a later serve of the same model on the same kind of GPU reuses it. Nothing to do on a CPU.")
    p.add_argument("--model", metavar="[NAME=]DIR|ID", action="append", help="checkpoint directory or Hugging Face "
                   "id, as serve takes it; repeat it to warm every model of a server of several, one after the other "
                   f"(default: serve's built-in random-weight '{serve.DEFAULT_PRESET}' checkpoint)")
    p.add_argument("--models", metavar="FILE", help="serve's models file instead of --model: every model in it, "
                   "each with the slots serve gives it without --gpus and --engines (its max_contexts, else its share "
                   "of its first GPU; docs/operations.md)")
    p.add_argument("--device", metavar="DEVICE", type=cli_args.device,
                   help="cpu, cuda or cuda:N (default: cuda when a GPU is visible, else cpu)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                   help="Talker and code predictor dtype (default: bfloat16 on GPU, float32 on CPU)")
    p.add_argument("--decoder-dtype", choices=["float32", "float16", "bfloat16"],
                   help="codec decoder dtype (default: float16 on a GPU where a probe of the checkpoint's decoder at load "
                   "gives >= 30 dB SNR against float32, else float32; float32 for a float32 model and on CPU: "
                   "docs/engine.md)")
    p.add_argument("--max-contexts", metavar="N", type=cli_args.integer(1), help="engine slots, as serve will be "
                   "given (default: sized from free GPU memory); the largest batch's kernels are tuned at this size; a models "
                   "file's max_contexts wins")
    p.add_argument("--max-batch", metavar="N", type=cli_args.integer(1), help="rows a step takes at most, as serve "
                   "will be given (default: --max-contexts when given, else 512 with 120 GiB of GPU memory or "
                   "more, 256 below): its graphs are captured up to it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")  # its phases
    kept = bytecode.use()               # before torch is imported: an image's warm-up fills this too
    import torch

    from talkgate.synth import compile_cache
    from talkgate.synth.engine import Engine

    specs = serve.served_specs(args.model, args.models)
    device = cli_args.check_device(args.device)
    if args.model or args.models:       # a wrong path is found before the first model's minutes of compiles
        from talkgate.synth.checkpoint_dir import resolve_path
        for spec in specs:
            resolve_path(spec.path)
    shares = {}                         # the slots serve sizes from a share of a GPU, warmed at that size
    if device != "cpu":
        gpus = [str(g) for g in range(cli_args.cuda_device_count())]
        for e in serve.engine_plan(specs, device, None, 1, args.max_contexts, gpus):
            shares.setdefault(e["model"], e.get("memory_share"))
    for m, spec in enumerate(specs):
        t0 = time.perf_counter()
        engine = Engine.from_pretrained(spec.path or str(serve.default_checkpoint()), device=device,
                                        dtype=args.dtype, decoder_dtype=args.decoder_dtype,
                                        max_contexts=spec.max_contexts or args.max_contexts, max_batch=args.max_batch,
                                        memory_share=shares.get(m))
        runner, name = engine.runner, spec.name
        if runner.device.type != "cuda":
            print(f"talkgate: {name} ({runner.num_slots} slots) on {runner.device.type}: nothing is compiled or "
                  "captured on this device; nothing to do")
            continue
        loaded = time.perf_counter()
        runner.warmup()
        runner.finish_compiles()        # a fresh cache's last helper (two rows' persistent kernels): in the cache too
        print(f"talkgate: warm-up of {name} ({engine.info.name}, {engine.info.size}, {runner.num_slots} slots) done "
              f"in {time.perf_counter() - loaded:.1f} s after a {loaded - t0:.1f} s load, {len(runner.graphs)} graphs;"
              " compile cache: " + ", ".join(f"{var}={os.environ.get(var)}" for var in compile_cache.ENV)
              + (f"; Python bytecode: {kept}" if kept else ""))
        del engine, runner              # the next model's slots are sized from the GPU memory this one frees
        torch.cuda.empty_cache()
    return 0
