"""Admin endpoints for operators and orchestrators: `POST /admin/drain` (the drain a SIGTERM starts, without
stopping the process), `GET /admin/drain` (where it stands) and `GET /v1/usage` (the usage log's totals). They need an admin key (every --api-key is one;
in a keys file, role admin); a server run without keys refuses them (403 admin_disabled) unless it was started
with --admin-without-key."""
from __future__ import annotations

import asyncio

from aiohttp import web

from talkgate.server.errors import ErrorResponse
from talkgate.server.gateway import Gateway, start_drain
from talkgate.server.usage import totals


def refusal(gw: Gateway, request: web.Request) -> ErrorResponse | None:
    if not gw.keyed:
        if gw.config.admin_without_key:
            return None
        return ErrorResponse(403, "admin_disabled", "the admin endpoints need --api-key or --keys (or "
                             "--admin-without-key)")
    if not gw.authorized(request):
        return ErrorResponse(401, "unauthorized", "a valid API key is required", {"WWW-Authenticate": "Bearer"})
    if not gw.identify(request).admin:
        gw.refused(request, "not_admin")
        return ErrorResponse(403, "forbidden", "the admin endpoints need an admin key")
    return None


def status(gw: Gateway) -> dict:
    """`drained`: contexts finished (or were cut off at the deadline) and every WebSocket was closed."""
    contexts, _ = gw.in_flight()
    return {"state": gw.state, "drained": gw.drain_task is not None and gw.drain_task.done(),
            "contexts": contexts, "sessions": len(gw.connections), "deadline_s": gw.config.shutdown_deadline_s}


async def drain(request: web.Request) -> web.Response:
    """Start the drain (once; again is a no-op), of every worker process: /ready 503 at once, new sessions
    refused, contexts in flight finish up to --shutdown-deadline, then WebSockets close with 1001. The process keeps answering /health
    (200, state draining) until it is stopped: SIGTERM then exits at once. `?wait=true` answers when the drain
    is over (200), else at once (202)."""
    gw: Gateway = request.app["gateway"]
    if (refused := refusal(gw, request)) is not None:
        return refused
    task = start_drain(request.app)
    if "drain_server" in request.app:   # a gateway worker: the other workers drain too (processes/worker.py)
        request.app["drain_server"]()
    if request.query.get("wait", "").lower() in ("1", "true", "yes"):
        await asyncio.shield(task)
    body = status(gw)
    return web.json_response(body, status=200 if body["drained"] else 202)


async def drain_status(request: web.Request) -> web.Response:
    gw: Gateway = request.app["gateway"]
    if (refused := refusal(gw, request)) is not None:
        return refused
    return web.json_response(status(gw))


async def usage(request: web.Request) -> web.Response:
    """Totals by key and model of the contexts that ended in [start, end) (unix seconds; either may be left out),
    of one key with `key_id`, read from the usage log (server/usage.py totals: its last 256 MiB at most)."""
    gw: Gateway = request.app["gateway"]
    if (refused := refusal(gw, request)) is not None:
        return refused
    if gw.usage.path is None:
        return ErrorResponse(404, "usage_disabled", "the server keeps no usage log (serve --usage-log PATH)")
    try:
        start, end = (float(request.query[k]) if k in request.query else None for k in ("start", "end"))
    except ValueError:
        return ErrorResponse(400, "invalid_request", "start and end are unix times in seconds")
    body = await asyncio.to_thread(totals, gw.usage.path, start, end, request.query.get("key_id"))
    return web.json_response({"start": start, "end": end, **body})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/usage", usage)
    app.router.add_post("/admin/drain", drain)
    app.router.add_get("/admin/drain", drain_status)
