"""What every handler of one server process shares (Gateway: the engine, its client, limits, metrics, the open
connections, access checks and who a client is, the WebSocket plumbing every WebSocket protocol goes through)
and the drain."""
from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from dataclasses import dataclass, field
from functools import partial

from aiohttp import web

from talkgate.server.audio_files import AudioFiles
from talkgate.server.audit import AuditLog
from talkgate.server.connection import Connection
from talkgate.server.engine_client import EngineClient
from talkgate.server.errors import ErrorResponse
from talkgate.server.latency_trace import LinkTrace, TraceFile
from talkgate.server.key_limits import KeyLimits
from talkgate.server.keys import OPEN, Identity, Keyring, KeysFile
from talkgate.server.metrics import ContextObserver, Metrics
from talkgate.server.usage import KeyAccount, UsageLog
from talkgate.server.voice_store import VoiceStore, default_root
from talkgate.server.websocket import GatewayWebSocket
from talkgate.sessions.limits import Limits
from talkgate.sessions.models import Models
from talkgate.sessions.session import Session
from talkgate.sessions.voices import VoiceMap, Voices, VoiceScope

log = logging.getLogger("talkgate.server")
DRAIN_POLL_S = 0.05      # how often a drain looks whether the contexts in flight have finished
CLOSE_WAIT_S = 5.0       # after the drain: how long closing sockets may take to write what is queued
KEYS_POLL_S = 2.0        # how often each worker looks whether the keys file changed
IDENTITY = "identity"    # request key: who the request is (Gateway.identify)


@dataclass
class ServerConfig:
    """A server process's settings. It crosses to the gateway workers as `dataclasses.asdict(config)` (JSON) and
    comes back as `ServerConfig(**d)`."""

    limits: Limits = field(default_factory=Limits)
    api_keys: tuple[str, ...] = ()            # empty (and no keys_file): no authentication
    keys_file: str | None = None              # JSON lines of hashed keys with tenants and roles (server/keys.py)
    audit_log: str | None = None              # JSON lines file the audit records are appended to (server/audit.py)
    allowed_origins: tuple[str, ...] = ()     # empty: any Origin; else browsers must match one
    shutdown_deadline_s: float = 10.0         # graceful shutdown: contexts may finish for this long
    voice_map: str | None = None              # JSON file: compatible APIs' voice ids -> talkgate voices
    voice_store: str | None = None            # the voice store's directory (None: voice_store.default_root())
    admin_without_key: bool = False           # /admin/* answers without api_keys (else refused: docs/operations.md)
    ssl_certfile: str | None = None           # PEM files: serve https:// and wss:// (server/listen.py tls_context)
    ssl_keyfile: str | None = None
    trace_latency: str | None = None          # JSON-lines file of each request's stage times (latency_trace.py)
    usage_log: str | None = None              # JSON-lines file of each finished context's usage (server/usage.py)
    key_limit_share: int = 1                  # worker processes each key's limits are split over (key_limits.py)
    audio_dir: str | None = None              # the workers' shared folder of audio served at a URL (audio_files.py)

    def __post_init__(self):
        # as JSON brings them back: an object and lists
        if isinstance(self.limits, dict):
            self.limits = Limits(**self.limits)
        self.api_keys, self.allowed_origins = tuple(self.api_keys), tuple(self.allowed_origins)


class Gateway:
    """State shared by every handler: the engine, limits, metrics, open connections."""

    def __init__(self, engine, config: ServerConfig, metrics: Metrics | None = None):
        """`engine`: the served models' engines (server/model_engines.py ModelEngines: in-process Engines, or a
        gateway worker's RemoteEngines)."""
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
        self.audio_files = AudioFiles(config.audio_dir)     # DashScope's non-streamed answers (None: made when used)
        self.models: Models | None = None          # the served models (with the client)
        self.voice_map = VoiceMap()                 # the compatible APIs' voice ids (app.create_app loads --voice-map)
        self.keys_file = KeysFile(config.keys_file) if config.keys_file else None    # KeysError: start-up fails
        self.api_keys = Keyring.from_secrets(config.api_keys)
        self.audit = AuditLog(config.audit_log)
        self.usage = UsageLog(config.usage_log)
        self.key_limits = KeyLimits(config.key_limit_share)
        self.voices_making = 0                     # uploads being decoded and made (voices_http.py) ...
        self.voices_making_of: dict[str, int] = {}  # ... by tenant (its cap counts them: keys file limit `voices`)
        self.trace_file = TraceFile(config.trace_latency) if config.trace_latency else None

    def link_trace(self, label: str) -> LinkTrace | None:
        """A new request's or connection's trace under serve --trace-latency (read now), else None."""
        return None if self.trace_file is None else LinkTrace(self.trace_file, label, time.monotonic_ns())

    @property
    def state(self) -> str:
        """starting (warming up), ready, or draining (shutting down)."""
        return "draining" if self.draining else "ready" if self.ready else "starting"

    def slots(self) -> tuple[int, int]:
        """(free, all) engine context slots."""
        stats = self.engine.stats()
        return stats["free_slots"], stats["slots"]

    def in_flight(self) -> tuple[int, int]:
        """(contexts of this gateway open in the engine, WebSocket connections with a context in flight)."""
        busy = sum(1 for c in self.connections if c.protocol.session.active)
        return (self.client.owned() if self.client is not None else 0), busy

    # ----- access control -----
    @property
    def keyed(self) -> bool:
        """Whether clients need a key (else every client is keys.OPEN: the default tenant, as before tenants)."""
        return self.keys_file is not None or bool(self.api_keys.keys)

    def identify_key(self, key: str | None) -> Identity | None:
        if not self.keyed:
            return OPEN
        return (self.keys_file.keyring if self.keys_file is not None else self.api_keys).identify(key)

    def identify(self, request: web.Request) -> Identity | None:
        """Who the request is, by its key (kept on the request); None: no key, or one not in force."""
        if IDENTITY not in request:
            request[IDENTITY] = self.identify_key(self.request_key(request))
        return request[IDENTITY]

    def refused(self, request: web.Request, reason: str) -> None:
        self.audit.key_refused(reason, path=request.path, remote=request.remote)

    def scope(self, who: Identity | None) -> VoiceScope:
        """The voices `who` may name (None: a client not yet authenticated: no stored voice)."""
        if who is None:
            return VoiceScope(Voices(self.client.info), self.voice_map.with_stored(lambda key: False))
        return VoiceScope(Voices(self.client.info, partial(self.store.get, who=who)),
                          self.voice_map.with_stored(partial(self.store.exists, who=who)))

    def authenticate(self, request: web.Request, key: str) -> VoiceScope | None:
        """A WebSocket's key sent in its first message -> the client's scope, or None (refused, audited)."""
        who = self.identify_key(key)
        if who is None:
            self.refused(request, "unknown_key")
            return None
        request[IDENTITY] = who
        return self.scope(who)

    def authenticate_connection(self, request: web.Request, conn, key: str) -> VoiceScope | None:
        """authenticate for a WebSocket (`conn()` is its Connection): a key over its connections limit closes it
        (1013, key_connections_limit) before the protocol says it is ready."""
        scope = self.authenticate(request, key)
        if scope is not None and (over := self.admit_connection(request)) is not None:
            conn().close(1013, over)
        return scope

    def admit_connection(self, request: web.Request) -> str | None:
        """The one check of a WebSocket's key against its connections limit, once its key is known (its upgrade's,
        or its first message's): counted (given back as it ends), or refused -> why (counted in /metrics; the
        request is nobody from here: nothing to give back)."""
        over = self.key_limits.connect(request[IDENTITY])
        if over is None:
            return None
        request[IDENTITY] = None
        self.count_error(over.code)
        return over.message

    def reload_keys(self, forced: bool = True) -> None:
        """SIGHUP (forced) or a poll: read the keys file again if it changed; audited either way it goes."""
        if self.keys_file is None:
            log.info("no keys file to reload (serve --keys FILE)")
            return
        if not forced and not self.keys_file.changed():
            return
        error = self.keys_file.reload()
        if error is None:
            self.audit.record("keys_reloaded", file=str(self.keys_file.path), keys=len(self.keys_file.keyring.keys))
        else:
            self.audit.record("keys_reload_refused", file=str(self.keys_file.path), line=error.line, why=error.why,
                              keys_in_force=len(self.keys_file.keyring.keys))

    async def watch_keys(self) -> None:
        while True:
            await asyncio.sleep(KEYS_POLL_S)
            self.reload_keys(forced=False)

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
        """Whether the request's key is in force (who it is: identify); a refusal is audited."""
        if self.identify(request) is not None:
            return True
        self.refused(request, "missing_key" if self.request_key(request) is None else "unknown_key")
        return False

    def keep_account(self, link: Connection, request: web.Request, api: str, admitted: bool = False) -> None:
        """The link's key account (its key's limits and usage), for its session and its writer; `admitted`: an
        HTTP request whose limits serve_speech took as a whole. None without a keys file (no key has limits) and
        without a usage log (nothing is recorded): then no frame pays for the accounting."""
        if self.keys_file is None and not self.usage.enabled:
            return
        account = KeyAccount(lambda: request.get(IDENTITY), self.key_limits, self.usage, api, admitted)
        link.account = link.protocol.session.account = account

    # ----- WebSocket plumbing shared by every WebSocket protocol -----
    def count_error(self, code: str) -> None:
        self.metrics.errors.labels(code).inc()

    async def serve_websocket(self, request: web.Request, label: str, make_protocol,
                              first_message_auth: bool = False) -> web.StreamResponse:
        """Accept, check limits and access, then run `make_protocol(session_id, authenticate)` over the
        socket. `authenticate`: None when the request's key was good (request[IDENTITY] is who it is), else, for
        a protocol whose first message may carry the key, `authenticate(key)` -> its VoiceScope or None. Refusals close with 1008 (policy) or 1013 (try later); while draining, the upgrade itself
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

    @property
    def full(self) -> bool:
        """Its WebSocket connections are at limits.max_connections (a worker's share of the server's): a new one is
        refused (1013), and a worker leaves new connections to the others (server/acceptor.py)."""
        return len(self.connections) >= self.limits.max_connections

    async def _run_websocket(self, request, ws, label, make_protocol, first_message_auth) -> None:
        refusal = None
        if self.draining:           # began after the upgrade
            refusal = (1001, "server shutting down", "shutting_down")
        elif not self.origin_ok(request):
            refusal = (1008, "origin not allowed", "origin_not_allowed")
        elif self.full:
            refusal = (1013, "too many connections, try again later", "too_many_connections")
        authenticate = None
        if refusal is None and self.identify(request) is None:
            if first_message_auth:
                authenticate = partial(self.authenticate_connection, request, lambda: conn)
            elif not self.authorized(request):
                refusal = (1008, "unauthorized", "unauthorized")
        if refusal is not None:
            self.count_error(refusal[2])
        elif request[IDENTITY] is not None and (over := self.admit_connection(request)) is not None:
            refusal = (1013, over)          # as the server's own too_many_connections
        if refusal is not None:
            await ws.close(code=refusal[0], message=refusal[1].encode())
            return
        session_id = f"s{next(self.ids)}-{secrets.token_hex(4)}"
        protocol = make_protocol(session_id, authenticate)
        conn = Connection(ws, request.transport, protocol, self.client, self.limits, label, self.count_error,
                          self.link_trace(f"ws:{label}"))
        self.keep_account(conn, request, label)
        self.connections.add(conn)
        gauge = self.metrics.connections.labels(label)
        gauge.inc()
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            gauge.dec()
            if request.get(IDENTITY) is not None:
                self.key_limits.disconnect(request[IDENTITY])

    def new_session(self, label: str, voices: Voices, defaults=None, player: bool = False) -> Session:
        """`voices`: what the client may name (scope(who).voices); `player`: the client plays the audio as it comes (a
        WebSocket's: Session's `player`)."""
        return Session(self.client.info, self.limits, self.client.new_tokenizer, defaults,
                       ContextObserver(self.metrics, label), contexts=self.client.contexts, voices=voices,
                       models=self.models, player=player)


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
