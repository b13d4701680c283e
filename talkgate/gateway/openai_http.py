"""OpenAI-compatible `POST /v1/audio/speech` and `GET /v1/audio/voices` (sessions/openai.py is the
translator). A streamed response is a Link like a WebSocket connection: the same outbox, error
funnel, slow-consumer and idle rules; a client that disconnects ends its context at once."""
from __future__ import annotations

import asyncio
import codecs

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from talkgate.gateway.connection import Link
from talkgate.gateway.server import ErrorResponse
from talkgate.sessions.actions import http_status
from talkgate.sessions.fields import SessionError, load_json
from talkgate.sessions.openai import Begin, Respond, SpeechProtocol, parse_request


class HttpStream(Link):
    """One /v1/audio/speech request, from its context's start to the response's end."""

    def __init__(self, request: web.Request, protocol: SpeechProtocol, engine, limits, count_error):
        super().__init__(request.transport, protocol, engine, limits, "openai", count_error)
        self.request = request
        self.response: web.StreamResponse | None = None

    def other(self, action) -> None:
        if isinstance(action, (Begin, Respond)):
            self.outbox.put(action)
        else:
            super().other(action)

    async def run(self) -> web.StreamResponse:
        self.apply(self.call("start"))
        writer = asyncio.create_task(self._write())
        watch = asyncio.create_task(self._watch())
        try:
            await asyncio.wait([writer, watch], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (writer, watch):
                t.cancel()
            await asyncio.gather(writer, watch, return_exceptions=True)
            self.end()
        if self.response is None:           # the client went away before any answer
            return web.Response(status=499, reason="Client Closed Request")
        return self.response

    async def _write(self) -> None:
        try:
            while (item := await self.outbox.get()) is not None:
                if isinstance(item, Respond):
                    self.response = web.Response(status=item.status, body=item.body, content_type=item.content_type)
                    self.response.code = item.error     # counted by the errors middleware
                    return
                if isinstance(item, Begin):
                    self.response = web.StreamResponse(headers={
                        "Content-Type": item.content_type, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
                    await self.response.prepare(self.request)
                    continue
                await self.response.write(item.data)
                n = len(item.data)
                self.delivery.wrote(n + len(f"{n:x}") + 4, item.stream, item.audio_ms)    # a chunk's framing
                if item.stream is not None:
                    self.call("note_sent", item.stream, item.audio_ms)
            if self._closing is not None and self._closing[0] == 1000:
                await self.response.write_eof()
            elif self.request.transport is not None:     # broken off: the client sees a truncated body
                self.request.transport.abort()
        except ConnectionError:
            pass


async def speech(request: web.Request) -> web.StreamResponse:
    gw = request.app["gateway"]
    if not gw.authorized(request):
        return ErrorResponse(401, "unauthorized", "a valid API key is required")
    if gw.draining:
        return ErrorResponse(503, "shutting_down", "the server is shutting down")
    try:
        raw = await request.read()          # over the body limit: 413 (the errors middleware answers it)
    except (RequestPayloadError, HttpProcessingError):
        # the rest of the body cannot be decoded either: it is over (aiohttp would read on after the
        # response and log the same error again), and so is the connection
        request.content.feed_eof()
        response = ErrorResponse(400, "invalid_body", "the body cannot be decoded (Content-Encoding)")
        response.force_close()
        return response
    try:
        codecs.lookup(request.charset or "utf-8")
        text = raw.decode(request.charset or "utf-8")
    except (LookupError, UnicodeDecodeError) as e:
        return ErrorResponse(400, "invalid_json", f"the body is not text in its charset ({e.__class__.__name__})")
    try:
        req = parse_request(load_json(text, 4 * gw.limits.max_message_bytes), gw.limits.max_http_input_chars)
        session = gw.new_session("openai", req.config)
    except SessionError as e:
        return ErrorResponse(http_status(e.code), e.code, e.message)
    return await HttpStream(request, SpeechProtocol(session, req), gw.client, gw.limits, gw.count_error).run()


async def voices(request: web.Request) -> web.Response:
    gw = request.app["gateway"]
    if not gw.authorized(request):
        return ErrorResponse(401, "unauthorized", "a valid API key is required")
    info = gw.client.info
    return web.json_response({"voices": [{"id": v, "name": v} for v in info.voices],
                              "languages": list(info.languages), "model": info.as_dict()})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/voices", voices)
