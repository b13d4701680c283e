"""The aiohttp application: one port for the WebSocket protocols, HTTP endpoints, metrics and the web page."""
from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import secrets
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from talkgate.gateway.connection import Connection
from talkgate.gateway.engine_client import EngineClient
from talkgate.gateway.metrics import ContextObserver, Metrics
from talkgate.gateway.voice_store import VoiceStore, default_root
from talkgate.gateway.websocket import GatewayWebSocket
from talkgate.sessions.limits import Limits
from talkgate.sessions.native import NativeProtocol
from talkgate.sessions.http import error_body
from talkgate.sessions.session import Session
from talkgate.sessions.voices import Voices

log = logging.getLogger("talkgate.server")
WEB_DIR = Path(__file__).resolve().parent.parent / "web"
DRAIN_POLL_S = 0.05      # how often a drain looks whether the contexts in flight have finished
CLOSE_WAIT_S = 5.0       # after the drain: how long closing sockets may take to write what is queued


@dataclass
class ServerConfig:
    limits: Limits = field(default_factory=Limits)
    api_keys: tuple[str, ...] = ()            # empty: no authentication
    allowed_origins: tuple[str, ...] = ()     # empty: any Origin; else browsers must match one
    shutdown_deadline_s: float = 10.0         # graceful shutdown: contexts may finish for this long
    voice_map: str | None = None              # JSON file: compatible APIs' voice ids -> talkgate voices
    voice_store: str | None = None            # the voice store's directory (None: voice_store.default_root())
    admin_without_key: bool = False           # /admin/* answers without api_keys (else refused: docs/operations.md)


class Gateway:
    """State shared by every handler: the engine, limits, metrics, open connections."""

    def __init__(self, engine, config: ServerConfig, metrics: Metrics | None = None):
        """`engine`: synth.engine.Engine (or an object with its connect/submit/disconnect/stats: a gateway
        worker's RemoteEngines)."""
        self.engine, self.config, self.limits = engine, config, config.limits
        self.metrics = metrics or Metrics()
        self.connections: set[Connection] = set()
        self.ids = itertools.count(1)
        self.ready = False          # the engine is warm (set by serve once its warm-up is over)
        self.draining = False       # shutting down: new sessions and requests are refused
        self.drain_task: asyncio.Task | None = None    # the drain, once a signal or POST /admin/drain started it
        self.hurry: list[asyncio.Event] = []           # any of them set cuts the drain short
        self.client: EngineClient | None = None    # the engine's client, made with the app (on its loop)
        self.store = VoiceStore(config.voice_store or default_root())
        self.voices: Voices | None = None          # what a `voice` names: the model's, the store's (with the client)
        self.voices_making = 0                     # uploads being decoded and made (voices_http.py)

    @property
    def state(self) -> str:
        """starting (warming up), ready, or draining (shutting down)."""
        return "draining" if self.draining else "ready" if self.ready else "starting"

    def slots(self) -> tuple[int | None, int | None]:
        """(free, all) engine context slots; None where the engine does not say."""
        stats = self.engine.stats() if hasattr(self.engine, "stats") else {}
        return stats.get("free_slots"), stats.get("slots")

    def in_flight(self) -> tuple[int, int]:
        """(contexts of this gateway open in the engine, WebSocket connections with a context in flight)."""
        busy = sum(1 for c in self.connections if getattr(getattr(c.protocol, "session", None), "active", None))
        return (self.client.owned() if self.client is not None else 0), busy

    # ----- access control -----
    def key_ok(self, key: str | None) -> bool:
        """Constant-time comparison of bytes (compare_digest refuses non-ASCII str: any key may come)."""
        if key is None:
            return False
        given = key.encode("utf-8", "surrogatepass")
        return any(hmac.compare_digest(given, k.encode("utf-8", "surrogatepass")) for k in self.config.api_keys)

    def request_key(self, request: web.Request) -> str | None:
        """An API key from the places clients put it: Authorization Bearer/Token (the scheme in any
        case, RFC 9110), the headers of the compatible APIs, or the query string."""
        scheme, _, credentials = request.headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() in ("bearer", "token") and credentials.strip():
            return credentials.strip()
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
    def count_error(self, code: str) -> None:
        self.metrics.errors.labels(code).inc()

    async def serve_websocket(self, request: web.Request, label: str, make_protocol,
                              first_message_auth: bool = False) -> web.StreamResponse:
        """Accept, check limits and access, then run `make_protocol(session_id, authenticate)` over the
        socket. Refusals close with 1008 (policy) or 1013 (try later); while draining, the upgrade itself
        is refused (HTTP 503 shutting_down).
        Nothing raised after the upgrade reaches aiohttp (it would write an HTTP 500 into the
        WebSocket stream): a failure is logged once, counted and closed with 1011."""
        # no permessage-deflate, though browsers and the websockets library offer it: audio does not
        # compress (deflating a 3840-byte PCM frame costs ~96 us of server CPU for 6%; an Opus packet
        # grows), and that CPU is what limits the number of streams (docs/benchmarks.md)
        if self.draining:
            # refused before the upgrade: a proxy tries another replica with the same request (nginx
            # proxy_next_upstream http_503, Envoy's retry policy: deploy/), and a client's connect fails, which
            # pipecat retries with backoff; a socket accepted and closed at once counts as a quick failure there
            return ErrorResponse(503, "shutting_down", "the server is shutting down", {"Retry-After": "1"})
        ws = GatewayWebSocket(heartbeat=20.0, max_msg_size=4 * self.limits.max_message_bytes, compress=False)
        await ws.prepare(request)
        try:
            await self._run_websocket(request, ws, label, make_protocol, first_message_auth)
        except Exception:
            log.exception("%s connection failed", label)
            self.count_error("internal_error")
            if not ws.closed:
                try:
                    await asyncio.wait_for(ws.close(code=1011, message=b"internal error"), 5)
                except (asyncio.TimeoutError, ConnectionError):
                    pass
        return ws

    async def _run_websocket(self, request, ws, label, make_protocol, first_message_auth) -> None:
        refusal = None
        if self.draining:           # began after the upgrade
            refusal = (1001, "server shutting down", "shutting_down")
        elif not self.origin_ok(request):
            refusal = (1008, "origin not allowed", "origin_not_allowed")
        elif len(self.connections) >= self.limits.max_connections:
            refusal = (1013, "too many connections, try again later", "too_many_connections")
        authenticate = None
        if refusal is None and not self.authorized(request):
            if first_message_auth:
                authenticate = self.key_ok
            else:
                refusal = (1008, "unauthorized", "unauthorized")
        if refusal is not None:
            self.count_error(refusal[2])
            await ws.close(code=refusal[0], message=refusal[1].encode())
            return
        session_id = f"s{next(self.ids)}-{secrets.token_hex(4)}"
        protocol = make_protocol(session_id, authenticate)
        conn = Connection(ws, request.transport, protocol, self.client, self.limits, label, self.count_error)
        self.connections.add(conn)
        gauge = self.metrics.connections.labels(label)
        gauge.inc()
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            gauge.dec()

    def new_session(self, label: str, defaults=None) -> Session:
        return Session(self.client.info, self.limits, self.client.new_tokenizer, defaults,
                       ContextObserver(self.metrics, label), contexts=self.client.contexts, voices=self.voices)


# ----- handlers -----
async def native_ws(request: web.Request) -> web.WebSocketResponse:
    gw: Gateway = request.app["gateway"]

    def make(session_id, authenticate):
        return NativeProtocol(gw.new_session("native"), gw.limits, session_id, authenticate)

    return await gw.serve_websocket(request, "native", make, first_message_auth=True)


async def health(request: web.Request) -> web.Response:
    """Liveness: 200 whenever the process serves HTTP; the body says its state and model."""
    gw: Gateway = request.app["gateway"]
    return web.json_response({"status": "ok", "state": gw.state, "model": gw.engine.info.as_dict()})


async def ready(request: web.Request) -> web.Response:
    """Readiness: 200 only when the engine is warm, the server is not draining and a context slot is
    free; else 503, the body's `reason` saying which (starting, draining, full)."""
    gw: Gateway = request.app["gateway"]
    free, slots = gw.slots()
    state = gw.state
    reason = state if state != "ready" else "full" if free == 0 else None
    body = {"ready": reason is None, "state": state, "free_slots": free, "slots": slots,
            "model": gw.engine.info.as_dict()}
    if reason is not None:
        body["reason"] = reason
    return web.json_response(body, status=200 if reason is None else 503)


async def metrics(request: web.Request) -> web.Response:
    gw: Gateway = request.app["gateway"]
    stats = gw.engine.stats() if hasattr(gw.engine, "stats") else {}
    gw.metrics.observe(stats, len(gw.connections), gw.limits.max_connections, gw.draining)
    return web.Response(body=gw.metrics.render(), content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(WEB_DIR / "index.html")


async def web_file(request: web.Request) -> web.FileResponse:
    """A file of the browser client; a missing one is a 404 in the JSON shape of every error (aiohttp's
    static route answers it from inside FileResponse, past the errors middleware, with an empty body)."""
    path = WEB_DIR / request.match_info["name"]
    if path.resolve().parent != WEB_DIR or not path.is_file() or path.suffix not in (".js", ".css", ".html", ".svg"):
        raise web.HTTPNotFound(text=f"no such file: /web/{request.match_info['name']}")
    return web.FileResponse(path)


class ErrorResponse(web.Response):
    """Every HTTP error talkgate answers, in one shape (OpenAI's, sessions.http.error_body)."""

    def __init__(self, status: int, code: str, message: str, headers=None):
        super().__init__(body=error_body(status, code, message), status=status, content_type="application/json",
                         headers=headers)
        self.code = code


HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
              405: "method_not_allowed", 408: "request_timeout", 413: "payload_too_large",
              415: "unsupported_media_type", 429: "rate_limited", 431: "headers_too_large",
              500: "internal_error", 501: "not_implemented", 503: "unavailable", 504: "timeout"}


def _http_code(status: int) -> str:
    return HTTP_CODES.get(status, "client_error" if status < 500 else "server_error")


@web.middleware
async def errors_as_json(request: web.Request, handler):
    """Every HTTP error as ErrorResponse, aiohttp's own (404, 405, 413, ...) included, counted in
    /metrics; an unexpected exception logged once and answered 500; a client that went away is
    neither (aiohttp finishes the response quietly)."""
    gw: Gateway = request.app["gateway"]
    try:
        response = await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        headers = {k: v for k, v in e.headers.items() if k in ("Allow", "Retry-After", "WWW-Authenticate")}
        message = e.text if e.text and not e.text.startswith(f"{e.status}:") else e.reason
        response = ErrorResponse(e.status, _http_code(e.status), message, headers)
    except ConnectionError:
        return web.Response(status=499, reason="Client Closed Request")
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        response = ErrorResponse(500, "internal_error", "internal server error")
    if response.status >= 400:
        gw.count_error(getattr(response, "code", None) or _http_code(response.status))
    return response


class JsonErrorHandler(RequestHandler):
    """What fails before any handler runs (a malformed request, a body aiohttp cannot decode) is
    answered by aiohttp itself, as text, and logged as an ERROR: this answers it in the shape of every
    other error (ErrorResponse), logging only the server's own failures as errors."""

    def handle_error(self, request, status: int = 500, exc=None, message=None):
        if status >= 500:
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
        else:
            self.log_debug("Bad request from %s: %s", request.remote, message or exc)
        if request.writer.output_size > 0:
            raise ConnectionError("the response had begun: no error response can follow")
        response = ErrorResponse(status, _http_code(status), message or HTTPStatus(status).phrase)
        response.force_close()
        count = getattr(self._manager, "count_error", None)
        if count is not None:
            count(_http_code(status))
        return response


class JsonErrorServer(web.Server):
    def __init__(self, *args, count_error=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.count_error = count_error

    def __call__(self) -> RequestHandler:
        return JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class AppRunner(web.AppRunner):
    """web.AppRunner whose server answers aiohttp's own request errors as JSON (JsonErrorHandler)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return JsonErrorServer(server.request_handler, request_factory=server.request_factory,
                               loop=server._loop, count_error=self._app["gateway"].count_error, **server._kwargs)


def create_app(engine, config: ServerConfig | None = None, gateway_metrics: Metrics | None = None) -> web.Application:
    from talkgate.gateway import admin, compat_http, compat_routes, openai_http, voices_http
    from talkgate.sessions.voices import VoiceMap

    gw = Gateway(engine, config or ServerConfig(), gateway_metrics)
    if hasattr(engine, "on_step"):
        engine.on_step = lambda ms, batch: gw.metrics.step_seconds.observe(ms / 1000)
    app = web.Application(middlewares=[errors_as_json], client_max_size=4 * gw.limits.max_message_bytes)
    app["gateway"] = gw
    app.router.add_get("/v1/ws", native_ws)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    openai_http.add_routes(app)
    voices_http.add_routes(app)
    compat_routes.add_routes(app, VoiceMap.load(gw.config.voice_map, stored=gw.store.exists))
    compat_http.add_routes(app)
    admin.add_routes(app)
    app.router.add_get("/", index)
    app.router.add_get("/web/{name}", web_file)
    app.on_startup.append(_start)
    app.on_shutdown.append(drain)
    app.on_cleanup.append(_stop)
    return app


async def _start(app: web.Application) -> None:
    gw: Gateway = app["gateway"]
    app["lag_watch"] = asyncio.create_task(gw.metrics.watch_loop_lag(sample=app.get("sample_metrics")))
    gw.client = EngineClient(gw.engine, asyncio.get_running_loop())
    gw.voices = Voices(gw.client.info, gw.store.get)
    if hasattr(gw.engine, "hold"):
        gw.engine.hold = gw.client.behind       # the engine waits while the loop is behind on its events


def start_drain(app: web.Application) -> asyncio.Task:
    """The drain (below), started at most once: /ready says 503 and new sessions are refused from here."""
    gw: Gateway = app["gateway"]
    if gw.drain_task is None:
        gw.draining = True
        gw.drain_task = asyncio.ensure_future(_drain(gw))
    return gw.drain_task


async def drain(app: web.Application, hurry: asyncio.Event | None = None) -> None:
    """Graceful shutdown, the listener still open: /ready says 503 at once, new WebSocket sessions and
    HTTP speech requests are refused (503), contexts in flight finish up to the shutdown deadline (or
    until `hurry` is set), then every WebSocket closes with 1001. One drain per server: a call while it
    runs (SIGTERM after POST /admin/drain) waits for the same one, which its `hurry` can cut short too."""
    if hurry is not None:
        app["gateway"].hurry.append(hurry)
    await asyncio.shield(start_drain(app))


async def _drain(gw: Gateway) -> None:
    loop = asyncio.get_running_loop()
    start, deadline_s = loop.time(), gw.config.shutdown_deadline_s
    contexts, busy = gw.in_flight()
    log.info("draining for up to %g s: %d context(s) in flight, %d WebSocket connection(s) open, %d of them with "
             "contexts in flight", deadline_s, contexts, len(gw.connections), busy)

    def hurried() -> bool:
        return any(e.is_set() for e in gw.hurry)

    while (contexts or busy) and loop.time() - start < deadline_s and not hurried():
        await asyncio.sleep(DRAIN_POLL_S)
        contexts, busy = gw.in_flight()
    elapsed = loop.time() - start
    if contexts or busy:
        log.warning("%s after %.1f s: cutting off %d context(s) in flight (%d WebSocket connection(s) with contexts "
                    "in flight)", "drain cut short by a second signal" if hurried() else "drain deadline reached",
                    elapsed, contexts, busy)
    else:
        log.info("drained in %.1f s: every context finished", elapsed)
    closing = list(gw.connections)
    for conn in closing:
        conn.close(1001, "server shutting down")
    end = loop.time() + CLOSE_WAIT_S
    while gw.connections and loop.time() < end:
        await asyncio.sleep(DRAIN_POLL_S)
    log.info("closed %d WebSocket connection(s) with 1001%s", len(closing),
             f" ({len(gw.connections)} did not finish closing within {CLOSE_WAIT_S:g} s)" if gw.connections else "")


async def _stop(app: web.Application) -> None:
    app["lag_watch"].cancel()
    app["gateway"].client.close()
