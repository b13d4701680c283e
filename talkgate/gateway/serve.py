"""`talkgate serve`: load the engine, bind the port, warm up, serve until SIGINT/SIGTERM."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path

from aiohttp import web

from talkgate.gateway.server import AppRunner, ServerConfig, create_app
from talkgate.sessions.limits import Limits

log = logging.getLogger("talkgate.serve")
DEFAULT_PRESET = "mini"


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
    p.add_argument("--max-contexts", type=int, help="engine slots (default: sized from free memory)")
    p.add_argument("--seed", type=seed_arg, help="sampling seed of contexts whose request sets none, so that the same "
                   "text and settings give the same audio (default: a fresh random seed each)")
    p.add_argument("--api-key", action="append", default=[], help="require this API key (repeatable); "
                   "also TALKGATE_API_KEYS=k1,k2")
    p.add_argument("--allow-origin", action="append", default=[], help="allowed browser Origin (repeatable); "
                   "default: any")
    d = Limits()
    p.add_argument("--max-message-bytes", type=int, default=d.max_message_bytes)
    p.add_argument("--max-messages-per-s", type=float, default=d.max_messages_per_s,
                   help="client messages a second per connection, on average (bursts of 5 s worth); past it: close 1008")
    p.add_argument("--max-text-chars", type=int, default=d.max_text_chars, help="text per context")
    p.add_argument("--max-contexts-per-connection", type=int, default=d.max_contexts_per_connection)
    p.add_argument("--max-connections", type=int, default=d.max_connections)
    p.add_argument("--idle-timeout", type=float, default=d.idle_timeout_s,
                   help="seconds without a client message or audio taken by the client before a connection is "
                   "closed, contexts or not")
    p.add_argument("--max-backlog-ms", type=int, default=d.max_backlog_ms,
                   help="audio of a context left unread by a client that is behind real time before the context "
                   "is cancelled (slow consumer)")
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


def run(args: argparse.Namespace) -> int:
    from talkgate.synth.engine import Engine

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    model = args.model or str(default_checkpoint())
    if (args.device or ("cuda" if _cuda_available() else "cpu")) == "cpu":
        # one intra-op thread: under load, two made the small CPU models several times slower, and
        # the other core is left to the event loop and the audio encoders
        import torch
        torch.set_num_threads(1)
    engine = Engine.from_pretrained(model, device=args.device, dtype=args.dtype, max_contexts=args.max_contexts,
                                    default_seed=args.seed)
    info = engine.info
    log.info("model %s (%s, %s) on %s/%s%s", info.name, info.model_type, info.size, info.device, info.dtype,
             " -- UNTRAINED RANDOM WEIGHTS: the audio is noise, not speech" if info.untrained else "")
    keys = tuple(args.api_key) + tuple(k for k in os.environ.get("TALKGATE_API_KEYS", "").split(",") if k)
    limits = Limits(max_message_bytes=args.max_message_bytes, max_messages_per_s=args.max_messages_per_s,
                    max_text_chars=args.max_text_chars,
                    max_contexts_per_connection=args.max_contexts_per_connection,
                    max_connections=args.max_connections, idle_timeout_s=args.idle_timeout,
                    max_backlog_ms=args.max_backlog_ms)
    config = ServerConfig(limits=limits, api_keys=keys, allowed_origins=tuple(args.allow_origin),
                          shutdown_deadline_s=args.shutdown_deadline, voice_map=args.voice_map)
    try:
        asyncio.run(_serve(engine, config, args.host, args.port))
    finally:
        engine.stop()
    return 0


async def _serve(engine, config: ServerConfig, host: str, port: int) -> None:
    app = create_app(engine, config)
    gw = app["gateway"]
    gw.ready = False
    runner = AppRunner(app, handle_signals=False, shutdown_timeout=config.shutdown_deadline_s + 5)
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
