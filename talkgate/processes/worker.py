"""A gateway worker process: the aiohttp server (sessions, tokenization, tempo, resampling, Opus, framing) on
the shared port, its engines reached over local sockets (ipc/remote_engines.py). Started by the supervisor
(`talkgate serve`, processes/supervisor.py) with its settings as JSON in TALKGATE_WORKER:

    {"index", "host", "port", "listen_fds", "models": [{"name", "aliases", "engines": [endpoint, ...]}, ...],
     "status_fd", "server": dataclasses.asdict(ServerConfig)}

Each served model's engines are one RemoteEngines, the models together one ModelEngines (server/model_engines.py).

Every worker accepts from the port's one socket (the supervisor's, server/listen.py shared), so a new connection
goes to a worker whose loop is free to take it (server/acceptor.py); its `limits.max_connections` is its own cap
(supervisor.py sizes it): a full worker leaves new connections to the others, and refuses with 1013 the few it still
takes (every worker full). It waits for a WELCOME of each model's engines (model info, tokenizer) before
it listens, is ready (/ready 200) while at least one engine of the default model is, and tells the supervisor
through its status pipe: "listening", "ready" (every model has a ready engine), "not_ready".
SIGTERM or SIGINT: drain as the single-process server does (refuse new sessions, let contexts finish up to
the shutdown deadline, a second signal cuts that short, close with 1001), then exit.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time

log = logging.getLogger("talkgate.worker")


# the Content-Type values of JSON bodies that clients send (the OpenAI SDKs, aiohttp's and requests' json=, curl -H)
JSON_CONTENT_TYPES = ("application/json", "application/json; charset=utf-8")


def warm_http() -> None:
    """An HTTP body is decoded in its Content-Type's charset (server/http_speech.py read_json), which aiohttp parses
    with the email package once per distinct value in a process (a cache): 0.35-0.7 ms, most of what a worker's first
    request paid more in its `parsed` stage (docs/benchmarks.md "A worker's first request"). Parse the usual values
    now."""
    from aiohttp import web

    for content_type in JSON_CONTENT_TYPES:
        _ = web.Response(headers={"Content-Type": content_type}).charset


def warm_gateway(engines) -> None:
    """First-use costs off the first requests (measured at 0.4 s for the tokenizer's files and 0.2 s for the
    encoders' libraries, a stall of the loop a worker's first context would meet): load the tokenizer from the
    checkpoint directory, make every encoding once and parse the usual Content-Types, before the worker listens."""
    import numpy as np

    from talkgate.codecs import ENCODINGS, FormatError, make_stream_encoder
    from talkgate.synth.api import FRAME_SAMPLES

    tokenizer = engines.new_tokenizer()
    tokenizer.feed("Warming up, one moment. ")
    tokenizer.finish()
    # a stream's first Han or kana delta asks the merges about every token that could extend it (about 10 ms for
    # a common character the first time, 0.1-0.3 ms after): common first words of replies, once each (12 ms)
    for word in "好的 您好 你好 我们 是的 这个 当然 没问题 今天 请问 はい ありがとうございます こんにちは 承知しました".split():
        tokenizer = engines.new_tokenizer()
        tokenizer.feed(word)
        tokenizer.finish()
    warm_http()
    silence = np.zeros(FRAME_SAMPLES, np.float32)
    for encoding, (rates, _) in ENCODINGS.items():
        for rate in sorted({rates[0], rates[-1]}):
            try:
                encoder = make_stream_encoder(encoding, rate)
            except FormatError:           # not available on this machine: refused to clients the same way
                continue
            encoder.encode(silence)
            encoder.flush()


class StatusPipe:
    """Lines to the supervisor; a gone supervisor is ignored (die_with_parent stops this process then)."""

    def __init__(self, fd: int | None):
        self.fd, self.last = fd, None

    def say(self, line: str) -> None:
        if self.fd is None or line == self.last:
            return
        self.last = line
        try:
            os.write(self.fd, (line + "\n").encode())
        except OSError:
            pass


async def serve_worker(cfg: dict) -> int:
    from talkgate.ipc.remote_engines import RemoteEngines
    from talkgate.server.acceptor import Acceptor
    from talkgate.server.app import create_app
    from talkgate.server.errors import AppRunner
    from talkgate.server.gateway import ServerConfig, drain, start_drain
    from talkgate.server.listen import BACKLOG, CLEANUP_TIMEOUT_S, shared, tls_context
    from talkgate.server.metrics import Metrics
    from talkgate.server.model_engines import ModelEngines
    from talkgate.system import heap
    from talkgate.system.schedstat import SchedStat

    index = cfg["index"]
    loop = asyncio.get_running_loop()
    stop, hurry = asyncio.Event(), asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: (hurry if stop.is_set() else stop).set())
    drain_asked = asyncio.Event()                   # SIGUSR1 from the supervisor: an admin drain, staying up
    loop.add_signal_handler(signal.SIGUSR1, drain_asked.set)
    # SIGHUP (from the supervisor): the keys reload once the app runs (server/app.py); until then it must not stop us
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    pauses = heap.GcPauses()
    schedstat = SchedStat()                         # of this thread, the event loop's
    status = StatusPipe(cfg.get("status_fd"))
    remotes = {m["name"]: RemoteEngines(m["engines"], worker=index) for m in cfg["models"]}
    for remote in remotes.values():
        remote.start()
    try:
        info = asyncio.ensure_future(asyncio.gather(*(remote.wait_info() for remote in remotes.values())))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([info, stopped], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            return 0
        engines = ModelEngines(remotes, {a: m["name"] for m in cfg["models"] for a in m.get("aliases", ())})
        config = ServerConfig(**cfg["server"])
        tls = tls_context(config.ssl_certfile, config.ssl_keyfile)
        warm_gateway(engines)
        metrics = Metrics(worker=index, engines=engines)
        app = create_app(engines, config, metrics)
        gw = app["gateway"]
        listening = False

        def on_state():
            gw.ready = engines.ready
            if listening:       # the supervisor's "ready on URL" waits for every model
                status.say("ready" if all(map(engines.model_ready, engines.names)) else "not_ready")

        def sample():
            metrics.worker_connections.labels(str(index)).set(len(gw.connections))
            metrics.worker_contexts.labels(str(index)).set(engines.stats()["contexts"])
            metrics.worker_cpu.labels(str(index)).set(time.process_time())
            metrics.worker_gc.labels(str(index)).set(pauses.seconds)
            if (thread := schedstat.read()) is not None:
                metrics.worker_cpu_wait.labels(str(index)).set(thread[1])
            metrics.worker_gc_max.labels(str(index)).set(pauses.longest)

        for remote in remotes.values():
            remote.on_state = on_state
            remote.on_delivery = metrics.step_delivery.labels(str(index)).observe
        app["sample_metrics"] = sample
        # POST /admin/drain on any worker drains them all: the supervisor signals every worker (SIGUSR1)
        app["drain_server"] = lambda: os.kill(os.getppid(), signal.SIGUSR1)

        async def drain_when_asked():
            await drain_asked.wait()
            start_drain(app)
        asked = asyncio.ensure_future(drain_when_asked())
        runner = AppRunner(app, handle_signals=False, shutdown_timeout=CLEANUP_TIMEOUT_S)
        await runner.setup()
        heap.freeze(f"worker {index} started")
        pauses.install()
        acceptor = Acceptor(asyncio.get_running_loop(), shared(cfg["listen_fds"]), runner.server, tls,
                            full=lambda: gw.full)
        try:
            acceptor.start(BACKLOG)
            # logged before the supervisor hears of it: whoever reads "listening" finds this line in the log
            log.info("worker %d (pid %d) listening on %s:%d, at most %d connections", index, os.getpid(),
                     cfg["host"], cfg["port"], config.limits.max_connections)
            listening = True
            status.say("listening")
            on_state()
            await stopped
            status.say("draining")
            await drain(app, hurry)     # contexts finish up to the deadline (a second signal: at once), then 1001
        finally:
            asked.cancel()
            acceptor.stop()
            await runner.cleanup()
        return 0
    finally:
        for remote in remotes.values():
            remote.close()


def main() -> int:
    from talkgate.sessions.limits import open_connections
    from talkgate.system import descriptors
    from talkgate.system.childproc import die_with_parent

    cfg = json.loads(os.environ["TALKGATE_WORKER"])
    die_with_parent()
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s worker{cfg['index']} %(name)s %(levelname)s %(message)s")
    # before the engines' sockets open
    descriptors.reserve(open_connections(cfg["server"]["limits"]["max_connections"])[1] + descriptors.SPARE)
    return asyncio.run(serve_worker(cfg))


if __name__ == "__main__":
    sys.exit(main())
