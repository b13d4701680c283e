"""The aiohttp application: one port for the WebSocket protocols, HTTP endpoints, metrics and the web page."""
from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from talkgate.gateway.connection import Connection
from talkgate.gateway.metrics import ContextObserver, Metrics
from talkgate.gateway.pump import EventPump
from talkgate.sessions.limits import Limits
from talkgate.sessions.native import NativeProtocol
from talkgate.sessions.session import Session
from talkgate.synth.api import EngineClient

log = logging.getLogger("talkgate.server")
WEB_DIR = Path(__file__).resolve().parent.parent / "web"


@dataclass
class ServerConfig:
    limits: Limits = field(default_factory=Limits)
    api_keys: tuple[str, ...] = ()            # empty: no authentication
    allowed_origins: tuple[str, ...] = ()     # empty: any Origin; else browsers must match one
    shutdown_deadline_s: float = 10.0         # graceful shutdown: contexts may finish for this long
    voice_map: str | None = None              # JSON file: compatible APIs' voice ids -> talkgate voices


class Gateway:
    """State shared by every handler: the engine, limits, metrics, open connections."""

    def __init__(self, engine: EngineClient, config: ServerConfig, metrics: Metrics | None = None):
        self.engine, self.config, self.limits = engine, config, config.limits
        self.metrics = metrics or Metrics()
        self.connections: set[Connection] = set()
        self.ids = itertools.count(1)
        self.ready = False
        self.draining = False
        self.pump: EventPump | None = None     # started with the app (it needs the running loop)

    # ----- access control -----
    def key_ok(self, key: str | None) -> bool:
        return key is not None and any(hmac.compare_digest(key, k) for k in self.config.api_keys)

    def request_key(self, request: web.Request) -> str | None:
        """An API key from the places clients put it: Authorization Bearer/Token, the headers of the
        compatible APIs, or the query string."""
        auth = request.headers.get("Authorization", "")
        for scheme in ("Bearer ", "Token "):
            if auth.startswith(scheme):
                return auth[len(scheme):].strip()
        for name in ("xi-api-key", "X-API-Key"):
            if request.headers.get(name):
                return request.headers[name]
        for name in ("api_key", "authorization", "xi_api_key"):
            if request.query.get(name):
                return request.query[name]
        return None

    def origin_ok(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        return origin is None or not self.config.allowed_origins or origin in self.config.allowed_origins

    def authorized(self, request: web.Request) -> bool:
        return not self.config.api_keys or self.key_ok(self.request_key(request))

    # ----- WebSocket plumbing shared by every WebSocket protocol -----
    async def serve_websocket(self, request: web.Request, label: str, make_protocol,
                              first_message_auth: bool = False) -> web.WebSocketResponse:
        """Accept, check limits and access, then run `make_protocol(session_id, connection_sink,
        authenticate)` over the socket. Refusals close with 1008 (policy) or 1013 (try later)."""
        # no permessage-deflate, though browsers and the websockets library offer it: audio does not
        # compress (deflating a 3840-byte PCM frame costs ~96 us of server CPU for 6%; an Opus packet
        # grows), and that CPU is what limits the number of streams (docs/benchmarks.md)
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=4 * self.limits.max_message_bytes, compress=False)
        await ws.prepare(request)
        refusal = None
        if self.draining:
            refusal = (1001, "server shutting down")
        elif not self.origin_ok(request):
            refusal = (1008, "origin not allowed")
        elif len(self.connections) >= self.limits.max_connections:
            refusal = (1013, "too many connections, try again later")
        authenticate = None
        if refusal is None and not self.authorized(request):
            if first_message_auth:
                authenticate = self.key_ok
            else:
                refusal = (1008, "unauthorized")
        if refusal is not None:
            self.metrics.errors.labels("refused").inc()
            await ws.close(code=refusal[0], message=refusal[1].encode())
            return ws
        session_id = f"s{next(self.ids)}-{secrets.token_hex(4)}"
        holder: list[Connection] = []
        protocol = make_protocol(session_id, lambda ev: self.pump.put(holder[0], ev), authenticate)
        conn = Connection(ws, protocol, self.limits.max_outbox_items, self.limits.idle_timeout_s)
        holder.append(conn)
        self.connections.add(conn)
        gauge = self.metrics.connections.labels(label)
        gauge.inc()
        try:
            await conn.run()
        except Exception:   # a bug in one connection must never take the server down
            log.exception("connection %s failed", session_id)
            self.metrics.errors.labels("internal_error").inc()
        finally:
            self.connections.discard(conn)
            gauge.dec()
        return ws

    def new_session(self, sink, label: str, defaults=None) -> Session:
        return Session(self.engine, sink, self.limits, defaults, ContextObserver(self.metrics, label))


# ----- handlers -----
async def native_ws(request: web.Request) -> web.WebSocketResponse:
    gw: Gateway = request.app["gateway"]

    def make(session_id, sink, authenticate):
        return NativeProtocol(gw.new_session(sink, "native"), gw.limits, session_id, authenticate)

    return await gw.serve_websocket(request, "native", make, first_message_auth=True)


async def health(request: web.Request) -> web.Response:
    gw: Gateway = request.app["gateway"]
    if gw.ready and not gw.draining:
        return web.json_response({"status": "ok", "model": gw.engine.info.as_dict()})
    return web.json_response({"status": "shutting_down" if gw.draining else "starting"}, status=503)


async def metrics(request: web.Request) -> web.Response:
    gw: Gateway = request.app["gateway"]
    stats = gw.engine.stats() if hasattr(gw.engine, "stats") else {}
    if "running" in stats:
        gw.metrics.engine_running.set(stats["running"])
    if "waiting" in stats:
        gw.metrics.engine_waiting.set(stats["waiting"])
    return web.Response(body=gw.metrics.render(), content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(WEB_DIR / "index.html")


@web.middleware
async def errors_as_json(request: web.Request, handler):
    """HTTP errors as {"error": {"code", "message"}} (OpenAI's shape); unexpected ones logged, 500."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        request.app["gateway"].metrics.errors.labels("internal_error").inc()
        return web.json_response({"error": {"code": "internal_error", "message": "internal server error"}},
                                 status=500)


def create_app(engine: EngineClient, config: ServerConfig | None = None,
               gateway_metrics: Metrics | None = None) -> web.Application:
    from talkgate.gateway import compat_routes, openai_http
    from talkgate.sessions.voices import VoiceMap

    gw = Gateway(engine, config or ServerConfig(), gateway_metrics)
    if hasattr(engine, "on_step"):
        engine.on_step = lambda ms, batch: gw.metrics.step_seconds.observe(ms / 1000)
    app = web.Application(middlewares=[errors_as_json], client_max_size=4 * gw.limits.max_message_bytes)
    app["gateway"] = gw
    app.router.add_get("/v1/ws", native_ws)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    openai_http.add_routes(app)
    compat_routes.add_routes(app, VoiceMap.load(gw.config.voice_map))
    app.router.add_get("/", index)
    app.router.add_static("/web/", WEB_DIR, show_index=False)
    app.on_startup.append(_start)
    app.on_shutdown.append(_drain)
    app.on_cleanup.append(_stop)
    return app


async def _start(app: web.Application) -> None:
    gw: Gateway = app["gateway"]
    app["lag_watch"] = asyncio.create_task(gw.metrics.watch_loop_lag(sample=app.get("sample_metrics")))
    gw.pump = pump = EventPump(asyncio.get_running_loop())
    if hasattr(gw.engine, "hold"):
        gw.engine.hold = pump.behind            # the engine waits while the gateway is behind on its events


async def _drain(app: web.Application) -> None:
    """Graceful shutdown: refuse new work, let contexts finish up to the deadline, then close 1001."""
    gw: Gateway = app["gateway"]
    gw.draining = True
    deadline = asyncio.get_running_loop().time() + gw.config.shutdown_deadline_s
    while any(c.protocol.session.active for c in gw.connections if hasattr(c.protocol, "session")):
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.05)
    for conn in list(gw.connections):
        conn.close(1001, "server shutting down")
    await asyncio.sleep(0.1)


async def _stop(app: web.Application) -> None:
    app["lag_watch"].cancel()
    app["gateway"].pump.stop()
