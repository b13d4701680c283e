"""An engine process's main: one per GPU (or one on the CPU), started by the supervisor (processes/supervisor.py).

    python -m talkgate.processes.engine_process --index 0 --endpoint ipc:///tmp/tg/engine-0.ipc --model DIR
    python -m talkgate.processes.engine_process --group '[["--index", "0", ...], ["--index", "1", ...]]'

It loads the model, then runs ipc/engine_server.py's EngineServer (warm-up, then the loop) on its main thread until
SIGTERM or SIGINT; it dies with its parent. With --group (`serve --colocate`: the models that share a GPU) it loads
each engine of the group, its arguments as one engine's, and runs their servers on its main thread as one
ipc/engine_group.py EngineGroup.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import sys
import threading

from talkgate.ipc.engine_group import EngineGroup
from talkgate.ipc.engine_server import EngineServer
from talkgate.system import heap
from talkgate.system.warmup_watchdog import DEFAULT_STALL_S

log = logging.getLogger("talkgate.engine_process")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="talkgate-engine", description="one engine process (started by talkgate serve)")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--endpoint", required=True, help="the socket to listen on for the workers, e.g. ipc:///tmp/tg/engine-0.ipc")
    p.add_argument("--model", required=True)
    p.add_argument("--device")
    p.add_argument("--dtype")
    p.add_argument("--decoder-dtype")
    p.add_argument("--max-contexts", type=int)
    p.add_argument("--max-batch", type=int)
    p.add_argument("--memory-share", type=float, help="fraction of the GPU's memory its slots are sized from, "
                   "where engine processes share the GPU (--max-contexts wins)")
    p.add_argument("--shared-gpu", action="store_true", help="other engines use this GPU too: no pass of "
                   "first frames apart (synth/engine.py first_frames_apart); the first-frame lane stays")
    p.add_argument("--seed", type=int)
    p.add_argument("--untrained-length", choices=["text-rule", "runaway"], default="text-rule")
    p.add_argument("--warmup-stall", type=float, default=DEFAULT_STALL_S)
    p.add_argument("--keep-warm", type=float, help="seconds: an idle engine touches its GPU this often; 0: never "
                   "(default: synth/engine.py KEEP_WARM_S, never with --shared-gpu)")
    p.add_argument("--every-graph", action="store_true",
                   help="capture every batch size's graph before ready (the supervisor's restart beside a sibling)")
    return p


def main(argv: list[str] | None = None) -> int:
    heap.hold_collections()         # until the models are loaded: their imports are most of a restart
    from talkgate.synth.engine import KEEP_WARM_S, Engine
    from talkgate.system.childproc import die_with_parent

    argv = sys.argv[1:] if argv is None else argv
    group = json.loads(argv[1]) if argv[:1] == ["--group"] and len(argv) == 2 else [argv]
    engines = [parser().parse_args(a) for a in group]
    die_with_parent()
    name = "engine" + ",".join(str(args.index) for args in engines)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(name)s %(levelname)s %(message)s")
    if (engines[0].device or "").startswith("cpu"):
        import torch
        torch.set_num_threads(1)     # as the single-process server: one intra-op thread on a CPU engine
    poller = select.poll()           # one for every server of the process
    servers = []
    # every model's load begun before any is finished: a fresh cache's compile helpers of all run side by side
    loads = [Engine.begin_pretrained(args.model, device=args.device, dtype=args.dtype,
                                     decoder_dtype=args.decoder_dtype, max_contexts=args.max_contexts,
                                     max_batch=args.max_batch, memory_share=args.memory_share,
                                     default_seed=args.seed, untrained_length=args.untrained_length,
                                     first_apart=not args.shared_gpu) for args in engines]
    for args, load in zip(engines, loads):
        engine = load()
        # where engine processes share the GPU a touch could wait behind another's kernel that holds every SM (the
        # persistent kernels), and a command arriving meanwhile with it: off there unless asked for
        engine.set_keep_warm(args.keep_warm if args.keep_warm is not None else None if args.shared_gpu else KEEP_WARM_S)
        servers.append(EngineServer(engine, args.endpoint, args.index, str(engine.runner.tts.path),
                                    args.warmup_stall, poller))
        log.info("engine %d: %s on %s/%s, %d slots, bound to %s (pid %d)", args.index, engine.info.name,
                 engine.info.device, engine.info.dtype, engine.runner.num_slots, args.endpoint, os.getpid())
    heap.freeze(f"{name} loaded")    # warm-up, which may compile for minutes, collects as usual
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run = servers[0] if len(servers) == 1 else EngineGroup(servers)
    try:
        run.warm_up(any(args.every_graph for args in engines))
        run.serve(stop)
    finally:
        run.close()
    return 0



if __name__ == "__main__":
    sys.exit(main())
