"""The aiohttp application: one port for the WebSocket protocols, HTTP endpoints, metrics and the web page."""
from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from aiohttp import web

from talkgate.server import admin, compat_http, compat_ws, openai_http, voices_http
from talkgate.server.engine_client import EngineClient
from talkgate.server.errors import errors_as_json
from talkgate.server.gateway import Gateway, ServerConfig, drain
from talkgate.server.metrics import Metrics
from talkgate.server.model_engines import ModelEngines
from talkgate.sessions.native import NativeProtocol
from talkgate.sessions.voices import VoiceMap

log = logging.getLogger("talkgate.server")
WEB_DIR = Path(__file__).resolve().parent.parent / "web"


# ----- handlers -----
async def native_ws(request: web.Request) -> web.WebSocketResponse:
    gw: Gateway = request.app["gateway"]

    def make(session_id, authenticate):
        session = gw.new_session("native", compat_ws.scope(request).voices, player=True)
        return NativeProtocol(session, gw.limits, session_id, authenticate)

    return await gw.serve_websocket(request, "native", make, first_message_auth=True)


async def health(request: web.Request) -> web.Response:
    """Liveness: 200 whenever the process serves HTTP; the body says its state and model."""
    gw: Gateway = request.app["gateway"]
    return web.json_response({"status": "ok", "state": gw.state, "model": gw.engine.info.as_dict()})


async def ready(request: web.Request) -> web.Response:
    """Readiness: 200 only when the engine is warm, the server is not draining and a context slot is
    free; else 503, the body's `reason` saying which (starting, draining, full). Of the default model, or with
    ?model=NAME of that served model (404 for a name not served)."""
    gw: Gateway = request.app["gateway"]
    name = request.query.get("model")
    if name is not None:            # one model's readiness: its engines, under the server's own state
        model = next((m for m in gw.models.all if m.name.lower() == name.lower()), None)
        if model is None:
            raise web.HTTPNotFound(text=f"no model {name!r}; served: {', '.join(m.name for m in gw.models.all)}")
        stats = gw.engine.model_stats(model.name)
        free, slots, info = stats["free_slots"], stats["slots"], model.info
        state = gw.state if gw.state != "ready" or gw.engine.model_ready(model.name) else "starting"
    else:
        free, slots = gw.slots()
        state, info = gw.state, gw.engine.info
    reason = state if state != "ready" else "full" if free == 0 else None
    body = {"ready": reason is None, "state": state, "free_slots": free, "slots": slots, "model": info.as_dict()}
    if reason is not None:
        body["reason"] = reason
    return web.json_response(body, status=200 if reason is None else 503)


async def metrics(request: web.Request) -> web.Response:
    gw: Gateway = request.app["gateway"]
    stats = gw.engine.stats()
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


def create_app(engine, config: ServerConfig | None = None, gateway_metrics: Metrics | None = None) -> web.Application:
    """`engine`: the served models' ModelEngines, or one engine (the one model it runs)."""
    gw = Gateway(ModelEngines.of(engine), config or ServerConfig(), gateway_metrics)
    app = web.Application(middlewares=[errors_as_json], client_max_size=4 * gw.limits.max_message_bytes)
    app["gateway"] = gw
    app.router.add_get("/v1/ws", native_ws)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    openai_http.add_routes(app)
    voices_http.add_routes(app)
    gw.voice_map = VoiceMap.load(gw.config.voice_map)
    compat_ws.add_routes(app)
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
    gw.models = gw.engine.models()
    if gw.keys_file is not None:
        app["keys_watch"] = asyncio.create_task(gw.watch_keys())
    # SIGHUP reloads the keys (in every worker: the supervisor passes it on), never stops the server
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, gw.reload_keys)
    gw.engine.hold = gw.client.behind       # nothing more is handed over while the loop is behind on its events


async def _stop(app: web.Application) -> None:
    app["lag_watch"].cancel()
    if "keys_watch" in app:
        app["keys_watch"].cancel()
    asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
    app["gateway"].client.close()
    app["gateway"].usage.sync()     # the last records synced now, not by a timer of a loop that ends
    app["gateway"].audio_files.close()      # a folder of its own only: a server's run folder is the supervisor's
