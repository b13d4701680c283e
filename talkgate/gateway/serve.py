"""`talkgate serve`: engine processes and gateway workers under a supervisor (gateway/supervisor.py), or with
`--workers 0` one process (load the engine, bind the port, warm up, serve until SIGINT/SIGTERM)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path

from aiohttp import web

from talkgate.gateway.server import ServerConfig, create_app
from talkgate.sessions.limits import Limits
from talkgate.synth.api import EngineError

log = logging.getLogger("talkgate.serve")
DEFAULT_PRESET = "mini"
MAX_DEFAULT_WORKERS = 8
DEFAULT_WORKERS_HELP = f"the cores less one per engine process, 1 to {MAX_DEFAULT_WORKERS}"


def default_checkpoint() -> Path:
    """The built-in default: a random-weight `mini` checkpoint, created once and cached."""
    from talkgate.synth.checkpoint import create_checkpoint

    root = Path(os.environ.get("TALKGATE_CACHE", Path.home() / ".cache" / "talkgate"))
    path = root / f"{DEFAULT_PRESET}-custom_voice"
    if not (path / "config.json").exists():
        log.info("creating the built-in default checkpoint (%s, random weights) in %s", DEFAULT_PRESET, path)
        tmp = path.with_name(path.name + ".partial")
        create_checkpoint(tmp, preset=DEFAULT_PRESET, variant="custom_voice")
        tmp.rename(path)    # atomic: a half-written default is never picked up
    return path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve the WebSocket/HTTP gateway",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", help="checkpoint directory or Hugging Face id (default: built-in random-weight "
                   f"'{DEFAULT_PRESET}' checkpoint, created once)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port (printed at start)")
    p.add_argument("--device", help="cuda, cpu (default: cuda when available)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="default: bfloat16 on GPU, float32 on CPU")
    p.add_argument("--gpus", help="'all' or GPU indices like 0,1: one engine process per GPU (default: all GPUs; "
                   "one engine process on the CPU where there is none or with --device cpu)")
    p.add_argument("--engines", type=int, default=1, help="engine processes per GPU (or on the CPU); more than "
                   "one on a GPU needs --max-contexts, as each would size its slots from the whole GPU")
    p.add_argument("--workers", type=int, help="gateway worker processes sharing the port (default: "
                   f"{DEFAULT_WORKERS_HELP}); 0: one process, the engine a thread in it")
    p.add_argument("--max-contexts", type=int, help="engine slots (default: sized from free memory)")
    p.add_argument("--seed", type=seed_arg, help="sampling seed of contexts whose request sets none, so that the same "
                   "text and settings give the same audio (default: a fresh random seed each)")
    p.add_argument("--api-key", action="append", default=[], help="require this API key (repeatable); "
                   "also TALKGATE_API_KEYS=k1,k2")
    p.add_argument("--allow-origin", action="append", default=[], help="allowed browser Origin (repeatable); "
                   "default: any")
    d = Limits()
    p.add_argument("--max-message-bytes", type=int, default=d.max_message_bytes)
    p.add_argument("--max-text-chars", type=int, default=d.max_text_chars, help="text per context")
    p.add_argument("--max-contexts-per-connection", type=int, default=d.max_contexts_per_connection)
    p.add_argument("--max-connections", type=int, default=d.max_connections, help="WebSocket connections of the "
                   "server; each worker takes at most 1.5x an even share")
    p.add_argument("--idle-timeout", type=float, default=d.idle_timeout_s, help="seconds")
    p.add_argument("--max-backlog-ms", type=int, default=d.max_backlog_ms,
                   help="unsent audio per context before it is cancelled (slow consumer)")
    p.add_argument("--voice-map", help="JSON file mapping the compatible APIs' voice ids to talkgate voices "
                   "(docs/compat.md)")
    p.add_argument("--shutdown-deadline", type=float, default=10.0, help="seconds contexts may finish at shutdown")
    p.set_defaults(func=run)


def seed_arg(text: str) -> int:
    """argparse type of a sampling seed (serve and synthesize): an integer of 64 bits, as the engine takes."""
    from talkgate.synth.api import SEED_RANGE, seed_fits
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not seed_fits(seed):
        raise argparse.ArgumentTypeError(f"must fit in 64 bits ({SEED_RANGE})")
    return seed


def _cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def default_workers(engines: int, cores: int | None = None) -> int:
    """Worker processes for `engines` engine processes on `cores` cores: a core per engine process (its step
    loop) and the rest for workers, at most MAX_DEFAULT_WORKERS (docs/benchmarks.md measures the choice)."""
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, min(MAX_DEFAULT_WORKERS, cores - engines))


def parse_gpus(text: str | None, count: int) -> list[int]:
    if text in (None, "all"):
        return list(range(count))
    try:
        gpus = [int(g) for g in text.split(",")]
    except ValueError:
        raise EngineError(f"--gpus {text!r}: give 'all' or GPU indices like 0,1") from None
    bad = [g for g in gpus if not 0 <= g < count]
    if bad or len(set(gpus)) != len(gpus):
        raise EngineError(f"--gpus {text!r}: this machine has {count} GPU(s) (indices 0-{count - 1}), each once")
    return gpus


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    model = args.model or str(default_checkpoint())
    device = args.device or ("cuda" if _cuda_available() else "cpu")
    if args.workers == 0:
        return run_single_process(args, model, device)
    from talkgate.gateway.supervisor import Plan, Supervisor
    gpus = None
    if device.startswith("cuda"):
        import torch
        gpus = parse_gpus(args.gpus, torch.cuda.device_count())
        if not gpus:
            raise EngineError("no GPU found: use --device cpu")
    elif args.gpus is not None:
        raise EngineError("--gpus needs --device cuda")
    if args.engines < 1:
        raise EngineError("--engines must be at least 1")
    if gpus is None:
        engines = [{"device": device, "cuda_visible": None}] * args.engines
    else:
        if args.engines > 1 and args.max_contexts is None:
            raise EngineError("--engines above 1 on a GPU needs --max-contexts (each engine process would size "
                              "its slots from the whole GPU's free memory)")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")     # the GPU indices are of the visible ones
        ids = visible.split(",") if visible else [str(g) for g in range(max(gpus) + 1)]
        engines = [{"device": "cuda", "cuda_visible": ids[g]} for g in gpus for _ in range(args.engines)]
    workers = args.workers if args.workers is not None else default_workers(len(engines))
    engine_args = []
    for flag, value in (("--dtype", args.dtype), ("--max-contexts", args.max_contexts), ("--seed", args.seed)):
        if value is not None:
            engine_args += [flag, str(value)]
    config = server_config(args)
    plan = Plan(host=args.host, port=args.port, model=model, engines=engines, workers=workers,
                engine_args=engine_args, limits=config.limits.as_dict(),
                server={"api_keys": list(config.api_keys), "allowed_origins": list(config.allowed_origins),
                        "shutdown_deadline_s": config.shutdown_deadline_s, "voice_map": config.voice_map})
    return Supervisor(plan).run()


def server_config(args: argparse.Namespace) -> ServerConfig:
    keys = tuple(args.api_key) + tuple(k for k in os.environ.get("TALKGATE_API_KEYS", "").split(",") if k)
    limits = Limits(max_message_bytes=args.max_message_bytes, max_text_chars=args.max_text_chars,
                    max_contexts_per_connection=args.max_contexts_per_connection,
                    max_connections=args.max_connections, idle_timeout_s=args.idle_timeout,
                    max_backlog_ms=args.max_backlog_ms)
    return ServerConfig(limits=limits, api_keys=keys, allowed_origins=tuple(args.allow_origin),
                        shutdown_deadline_s=args.shutdown_deadline, voice_map=args.voice_map)


def run_single_process(args: argparse.Namespace, model: str, device: str) -> int:
    """The engine as a thread of the gateway process (`--workers 0`): no IPC, one GIL."""
    from talkgate.synth.engine import Engine

    if device == "cpu":
        # one intra-op thread: under load, two made the small CPU models several times slower, and
        # the other core is left to the event loop and the audio encoders
        import torch
        torch.set_num_threads(1)
    engine = Engine.from_pretrained(model, device=device, dtype=args.dtype, max_contexts=args.max_contexts,
                                    default_seed=args.seed)
    info = engine.info
    log.info("model %s (%s, %s) on %s/%s%s", info.name, info.model_type, info.size, info.device, info.dtype,
             " -- UNTRAINED RANDOM WEIGHTS: the audio is noise, not speech" if info.untrained else "")
    config = server_config(args)
    try:
        asyncio.run(_serve(engine, config, args.host, args.port))
    finally:
        engine.stop()
    return 0


async def _serve(engine, config: ServerConfig, host: str, port: int) -> None:
    app = create_app(engine, config)
    gw = app["gateway"]
    gw.ready = False
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=config.shutdown_deadline_s + 5)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    print(f"talkgate: listening on http://{host}:{bound} (warming up)", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await asyncio.to_thread(engine.start)      # warm-up and graph capture; /health says 503 meanwhile
    gw.ready = True
    print(f"talkgate: ready on http://{host}:{bound}", flush=True)
    await stop.wait()
    print("talkgate: shutting down", flush=True)
    await runner.cleanup()     # on_shutdown drains contexts up to the deadline, then closes with 1001
