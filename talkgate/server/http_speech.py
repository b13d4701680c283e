"""The I/O of every HTTP speech endpoint (sessions/http.py is the protocol side): the request's checks
(key, drain, body), then one response streamed from its context. A streamed response is a Link like a
WebSocket connection: the same outbox, error funnel, slow-consumer and idle rules, and the one path
engine events take (server/engine_client.py); a client that disconnects ends its context at once."""
from __future__ import annotations

import asyncio
import codecs
from dataclasses import replace
from typing import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from talkgate.server.connection import Link
from talkgate.server.errors import respond
from talkgate.server.gateway import IDENTITY
from talkgate.sessions.actions import http_status
from talkgate.sessions.fields import SessionError, load_json
from talkgate.sessions.http import Begin, HttpSpeech, Respond, error_response


class HttpStream(Link):
    """One speech request, from its context's start to the response's end."""

    def __init__(self, request: web.Request, protocol: HttpSpeech, engine, limits, label: str, count_error,
                 trace=None):
        super().__init__(request.transport, protocol, engine, limits, label, count_error, trace)
        self.request = request
        self.response: web.StreamResponse | None = None

    def writable(self) -> bool:
        return self.request.transport is not None and not self.request.transport.is_closing()

    def other(self, action) -> None:
        if isinstance(action, (Begin, Respond)):
            self.outbox.put(action)
            if getattr(action, "stream", None) is not None and self.account is not None and not self.outbox.closed:
                self.account.queued(action.stream)      # a whole body of audio: metered once written (_write)
        else:
            super().other(action)

    async def run(self) -> web.StreamResponse:
        self.call(self.protocol.start)
        self.engine.send_now()      # the open goes ahead: the engine opens the slot while the text is tokenized
        self.call(self.protocol.speak)
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
            while (item := await self.next_frame()) is not None:
                if isinstance(item, Respond):
                    self.response = respond(item)
                    if item.stream is not None:     # audio sent whole: metered as it goes to the socket
                        if not self.writable():
                            return
                        self.metered(item.stream, item.audio_ms)
                        await self.response.prepare(self.request)
                        await self.response.write_eof()
                        self.wrote_audio(item.stream, item.audio_ms)
                    return
                if isinstance(item, Begin):
                    self.response = web.StreamResponse(headers={
                        "Content-Type": item.content_type, "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                        **dict(item.headers)})
                    await self.response.prepare(self.request)
                    continue
                if item.stream is not None:
                    if not self.writable():
                        return              # the client went away (the watch sees it too)
                    self.metered(item.stream, item.audio_ms)
                await self.response.write(item.data)
                n = len(item.data)
                self.delivery.wrote(n + len(f"{n:x}") + 4, item.stream, item.audio_ms)    # a chunk's framing
                if item.stream is not None:
                    self.wrote_audio(item.stream, item.audio_ms)
            if self._closing is not None and self._closing[0] == 1000:
                await self.response.write_eof()
            elif self.request.transport is not None:     # broken off: the client sees a truncated body
                self.request.transport.abort()
        except ConnectionError:
            pass


class BodyTooLarge(SessionError):
    """A body over the server's limit (aiohttp's client_max_size): 413, in the API's own shape."""

    status = 413

    def __init__(self, max_bytes: int):
        super().__init__("payload_too_large", f"the body is over {max_bytes} bytes (4 x --max-message-bytes)")


class BodyTimeout(SessionError):
    """A body that did not arrive within the idle timeout: 408, in the API's own shape (the connection closes)."""

    status = 408

    def __init__(self, seconds: float):
        super().__init__("request_timeout", f"the body did not arrive within {seconds:g} s (--idle-timeout)")


async def arriving(request: web.Request, idle_s: float, reading: Awaitable):
    """What `reading` (a read of the request's body) returns, or BodyTimeout when it takes over idle_s; the rest of
    the body is then left unread (aiohttp would wait 10 s more for it), and the caller's response closes."""
    try:
        return await asyncio.wait_for(reading, idle_s)
    except TimeoutError:
        request.content.feed_eof()
        raise BodyTimeout(idle_s) from None


async def read_json(request: web.Request, max_bytes: int, idle_s: float) -> object:
    """The request's JSON body, all arrived within idle_s; raises SessionError (invalid_body, invalid_json,
    message_too_large, payload_too_large: BodyTooLarge, request_timeout: BodyTimeout)."""
    try:
        # the whole body: at most 4 x --max-message-bytes, 2 KiB/s at the defaults
        raw = await arriving(request, idle_s, request.read())
    except web.HTTPRequestEntityTooLarge:       # its body, or what it inflates to, over client_max_size
        raise BodyTooLarge(request.client_max_size) from None
    except (RequestPayloadError, HttpProcessingError):
        # the rest of the body cannot be decoded either: it is over (aiohttp would read on after the
        # response and log the same error again), and so is the connection
        request.content.feed_eof()
        raise SessionError("invalid_body", "the body cannot be decoded (Content-Encoding)") from None
    try:
        codecs.lookup(request.charset or "utf-8")
        text = raw.decode(request.charset or "utf-8")
    except (LookupError, UnicodeDecodeError) as e:
        raise SessionError("invalid_json", f"the body is not text in its charset ({e.__class__.__name__})") from None
    return load_json(text, max_bytes)


async def serve_speech(request: web.Request, label: str, make: Callable[[object], Awaitable[HttpSpeech]],
                       error: Callable[[int, str, str], Respond] = error_response) -> web.StreamResponse:
    """Check the key and the drain, read the JSON body, `await make(body)` the protocol (SessionError: the
    request's mistake; one with a `status` of its own, AudioError's or BodyTooLarge's, answered with it) and
    stream its response. Errors before the context starts are `error(status, code, message)`: the API's own
    error shape."""
    gw = request.app["gateway"]
    trace = gw.link_trace(f"http:{label}")  # None unless serve --trace-latency; first: the request's read time
    if not gw.authorized(request):
        return respond(error(401, "unauthorized", "a valid API key is required"))
    if gw.draining:
        return respond(error(503, "shutting_down", "the server is shutting down"))
    try:
        protocol = await make(await read_json(request, 4 * gw.limits.max_message_bytes, gw.limits.idle_timeout_s))
    except SessionError as e:
        response = respond(error(e.status or http_status(e.code), e.code, e.message))
        if e.code in ("invalid_body", "payload_too_large", "request_timeout"):     # the rest of the body is not read
            response.force_close()
        return response
    who = request[IDENTITY]
    if (over := gw.key_limits.start_context(who, len(protocol.text))) is not None:
        refused = error(429, over.code, over.message)
        return respond(replace(refused, headers=(*refused.headers, ("Retry-After", str(over.retry_after_s)))))
    stream = HttpStream(request, protocol, gw.client, gw.limits, label, gw.count_error, trace)
    gw.keep_account(stream, request, label, admitted=True)
    try:
        return await stream.run()
    finally:
        gw.key_limits.end_context(who)
