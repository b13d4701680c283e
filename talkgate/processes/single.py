"""`talkgate serve --workers 0`: one process, the engine a thread of it (docs/design.md).

The port is bound before the model loads (cli/serve.py), so that a busy port is reported at once; HTTP answers from
the end of the load on (/health 200 "starting", /ready 503 until the warm-up is over); SIGINT/SIGTERM drains (a
second signal cuts the drain short), then the engine stops.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl

from talkgate.system.warmup_watchdog import DEFAULT_STALL_S, WarmupWatchdog

log = logging.getLogger("talkgate.serve")


def load_engine(model: str, device: str, dtype: str | None, decoder_dtype: str | None, max_contexts: int | None,
                max_batch: int | None, seed: int | None, untrained_length: str):
    from talkgate.synth.engine import Engine

    if device == "cpu":
        # one intra-op thread: under load, two made the small CPU models several times slower, and
        # the other core is left to the event loop and the audio encoders
        import torch
        torch.set_num_threads(1)
    log.info("loading %s on %s", model, device)
    engine = Engine.from_pretrained(model, device=device, dtype=dtype, decoder_dtype=decoder_dtype,
                                    max_contexts=max_contexts, max_batch=max_batch, default_seed=seed,
                                    untrained_length=untrained_length)
    info = engine.info
    log.info("%d slots, steps of at most %d rows", engine.runner.num_slots, engine.runner.max_batch)
    log.info("model %s (%s, %s) on %s/%s%s", info.name, info.model_type, info.size, info.device, info.dtype,
             " -- UNTRAINED RANDOM WEIGHTS: the audio is noise, not speech" if info.untrained else "")
    return engine


def _start(engine, warmup_stall_s: float) -> None:
    from talkgate.processes.worker import warm_gateway

    with WarmupWatchdog(engine.runner, warmup_stall_s, "engine"):
        engine.start()
    warm_gateway(engine)            # the gateway's first uses, as a worker's (its tokenizer, encoders, Content-Types)


async def serve(engine, config, sockets: list[socket.socket], url: str, tls: ssl.SSLContext | None = None,
                warmup_stall_s: float = DEFAULT_STALL_S) -> int:
    """Serve until the first SIGINT/SIGTERM, drain (a second signal cuts it short), stop. -> exit status."""
    from aiohttp import web

    from talkgate.server.app import create_app
    from talkgate.server.errors import AppRunner
    from talkgate.server.gateway import drain
    from talkgate.server.listen import BACKLOG, CLEANUP_TIMEOUT_S
    from talkgate.system import heap

    app = create_app(engine, config)
    gw = app["gateway"]
    engine.on_step = lambda ms, batch: gw.metrics.step_seconds.observe(ms / 1000)     # on the engine's thread
    runner = AppRunner(app, handle_signals=False, shutdown_timeout=CLEANUP_TIMEOUT_S)
    await runner.setup()
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: (hurry if stop.is_set() else stop).set())
    try:
        for s in sockets:
            await web.SockSite(runner, s, backlog=BACKLOG, ssl_context=tls).start()
        print(f"talkgate: listening on {url} (warming up)", flush=True)
        # compiles and the first-audio graphs (the other buckets follow in the background)
        warm = asyncio.ensure_future(asyncio.to_thread(_start, engine, warmup_stall_s))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([warm, stopped], return_when=asyncio.FIRST_COMPLETED)
        if warm.done():
            if warm.exception() is not None:
                log.error("engine warm-up failed", exc_info=warm.exception().__cause__ or warm.exception())
                return 1
            heap.freeze("warm")
            gw.ready = True
            print(f"talkgate: ready on {url}", flush=True)
        await stopped
        await drain(app, hurry)
    finally:
        await runner.cleanup()
    print("talkgate: stopped", flush=True)
    return 0
