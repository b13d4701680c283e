"""Every HTTP error talkgate answers, counted in /metrics: the handlers' own (ErrorResponse), aiohttp's (404, 405,
413, ... through the errors_as_json middleware) and those aiohttp answers before any handler runs (AppRunner's
request handler). In talkgate's shape (OpenAI's: sessions.http.error_body), or on a vendor API's route in that API's
own: its error function, given where the route is added (add_route)."""
from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from talkgate.sessions.http import Respond, error_body
from talkgate.sessions.limits import open_connections

log = logging.getLogger("talkgate.server")


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


def respond(item: Respond) -> web.Response:
    response = web.Response(status=item.status, body=item.body, content_type=item.content_type,
                            headers=dict(item.headers))
    response.code = item.error          # counted by the errors middleware
    return response


ErrorFor = Callable[[str], "Callable[[int, str, str], Respond | web.Response] | None"]
ROUTE_ERRORS = web.AppKey("route_errors", list)     # the app's [(path, its part before any {variable}, error function)]


def add_route(app: web.Application, method: str, path: str, handler, error) -> None:
    """A route whose refusals aiohttp answers before the handler does (a method it does not take; for a path with a
    {variable}, also any path under the part before it) are in the shape of `error(status, code, message)`, the
    error function of the API it belongs to, as the handler's own."""
    app.router.add_route(method, path, handler)
    app.setdefault(ROUTE_ERRORS, []).append((path, path.split("{")[0] if "{" in path else None, error))


def error_for(app: web.Application) -> ErrorFor:
    """path -> the error function of the route (add_route) it falls under, None: talkgate's own shape."""
    routes = app.get(ROUTE_ERRORS, ())

    def error_for_path(path: str):
        return next((error for exact, under, error in routes
                     if path == exact or (under is not None and path.startswith(under))), None)
    return error_for_path


def shaped_error(error_for_path: ErrorFor | None, path: str, status: int, message: str,
                 headers=None, code: str | None = None) -> web.Response:
    """An error (status, message; code: the status's own unless given) in the shape of the API whose path it is,
    else ErrorResponse."""
    code = code or _http_code(status)
    shape = error_for_path(path) if error_for_path is not None else None
    if shape is None:
        return ErrorResponse(status, code, message, headers)
    item = shape(status, code, message)
    # the voice APIs' error functions answer web.Responses (voices_http.py), the speech APIs' Respond
    response = item if isinstance(item, web.Response) else respond(item)
    response.headers.update(headers or {})
    response.code = getattr(response, "code", None) or code
    return response


@web.middleware
async def errors_as_json(request: web.Request, handler):
    """Every HTTP error as ErrorResponse, aiohttp's own (404, 405, 413, ...) included, counted in
    /metrics; an unexpected exception logged once and answered 500; a client that went away is
    neither (aiohttp finishes the response quietly)."""
    gw = request.app["gateway"]
    try:
        response = await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        headers = {k: v for k, v in e.headers.items() if k in ("Allow", "Retry-After", "WWW-Authenticate")}
        message = e.text if e.text and not e.text.startswith(f"{e.status}:") else e.reason
        response = shaped_error(error_for(request.app), request.path, e.status, message, headers)
    except ConnectionError:
        return web.Response(status=499, reason="Client Closed Request")
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        response = ErrorResponse(500, "internal_error", "internal server error")
    if response.status >= 400:
        gw.count_error(getattr(response, "code", None) or _http_code(response.status))
    return response


OVER_CAP_IDLE_S = 1.0     # a connection past the cap that sends no request is closed after this
# answered past the cap too (then the connection closes): an orchestrator's liveness probe must not restart a full
# server, its readiness probe and the metrics scrape say what they would
PROBES = frozenset({"/health", "/ready", "/metrics"})


class JsonErrorHandler(RequestHandler):
    """What fails before any handler runs (a malformed request, a body aiohttp cannot decode) is
    answered by aiohttp itself, as text, and logged as an ERROR: this answers it in the shape of every
    other error (ErrorResponse), logging only the server's own failures as errors. A connection accepted past the
    process's cap (sessions.limits.open_connections) has its request answered 503 too_many_connections (in its API's
    shape, Retry-After: 1), a probe's (PROBES) as ever, then closes; past the hard cap it is closed at once."""

    def connection_made(self, transport) -> None:
        open_now = len(self._manager.connections)
        if open_now < self._manager.cap:
            super().connection_made(transport)
            return
        # set before aiohttp schedules its idle close and starts reading
        self._served, self._request_handler = self._request_handler, self._over_cap
        self._keepalive_timeout = OVER_CAP_IDLE_S
        super().connection_made(transport)
        self._manager.count_error("too_many_connections")
        if open_now >= self._manager.hard_cap:
            transport.abort()

    async def _over_cap(self, request: web.Request) -> web.StreamResponse:
        if request.path in PROBES:
            response = await self._served(request)
            response.force_close()
            return response
        response = shaped_error(self._manager.error_for_path, request.path, 503,
                                "too many connections, try again later", {"Retry-After": "1"},
                                code="too_many_connections")
        response.force_close()
        return response

    def handle_error(self, request, status: int = 500, exc=None, message=None):
        if status >= 500:
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
        else:
            self.log_debug("Bad request from %s: %s", request.remote, message or exc)
        if request.writer.output_size > 0:
            raise ConnectionError("the response had begun: no error response can follow")
        try:
            path = request.path
        except Exception:                   # a request line aiohttp could not parse
            path = ""
        response = shaped_error(self._manager.error_for_path, path, status,
                                message or HTTPStatus(status).phrase)
        response.force_close()
        self._manager.count_error(response.code)        # the JsonErrorServer that made this handler
        return response


class JsonErrorServer(web.Server):
    def __init__(self, *args, count_error: Callable[[str], None], max_connections: int,
                 error_for_path: ErrorFor | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.count_error, self.error_for_path = count_error, error_for_path
        self.cap, self.hard_cap = open_connections(max_connections)

    def __call__(self) -> RequestHandler:
        return JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class AppRunner(web.AppRunner):
    """web.AppRunner whose server answers aiohttp's own request errors as JSON (JsonErrorHandler), holds the process's
    connections to its cap (JsonErrorHandler.connection_made), and closes an HTTP connection that has sent no request,
    or not all of its request's head, or nothing since its last response, for the idle timeout (aiohttp's keep-alive
    timeout, an hour by default: a client that opened connections and sent nothing held their descriptors that long;
    docs/protocol.md, Limits)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        gw = self._app["gateway"]
        return JsonErrorServer(server.request_handler, request_factory=server.request_factory,
                               loop=server._loop, count_error=gw.count_error, error_for_path=error_for(self._app),
                               max_connections=gw.limits.max_connections,
                               **{**server._kwargs, "keepalive_timeout": gw.limits.idle_timeout_s})
