"""OpenAI-compatible `POST /v1/audio/speech` and `GET /v1/audio/voices`: a translator onto Session.

Streaming (`stream: true`): `stream_format: "audio"` writes the encoded audio as a chunked body as
it is generated (PCM: raw s16le 24 kHz, `audio/pcm`); `"sse"` sends `speech.audio.delta` events with
base64 audio and a final `speech.audio.done`. Otherwise the whole file is returned at the end.
A client that disconnects cancels the work.
"""
from __future__ import annotations

import asyncio
import base64
import json

from aiohttp import web

from talkgate.sessions.session import (
    AudioFormat, AudioOut, ContextConfig, ContextError, ContextFinished, SessionError, field_of,
)
from talkgate.synth.api import SamplingParams

# response_format -> (session encoding, sample rate, content type)
FORMATS = {
    "pcm": ("pcm_s16le", 24000, "audio/pcm"),
    "wav": ("wav", 24000, "audio/wav"),
    "mp3": ("mp3", 24000, "audio/mpeg"),
    "opus": ("ogg_opus", 24000, "audio/ogg"),   # players decode Ogg/Opus at 48 kHz whatever the input rate
    "flac": ("flac", 24000, "audio/flac"),
}
CONTEXT = "speech"


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "code": code}},
                             status=status)


class BadRequest(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def parse_request(body: object, max_chars: int) -> tuple[str, ContextConfig, str, bool, str]:
    """-> (input text, context config, response_format, stream, stream_format); raises BadRequest."""
    try:
        return _parse(body, max_chars)
    except SessionError as e:     # a missing or mistyped field: OpenAI calls it invalid_request
        raise BadRequest("invalid_request", e.message) from None


def _parse(body: object, max_chars: int) -> tuple[str, ContextConfig, str, bool, str]:
    if not isinstance(body, dict):
        raise BadRequest("invalid_request", "the body must be a JSON object")
    text = field_of(body, "input", str, required=True)
    if not text.strip():
        raise BadRequest("invalid_request", "input is empty")
    if len(text) > max_chars:
        raise BadRequest("text_too_long", f"input is limited to {max_chars} characters")
    fmt = field_of(body, "response_format", str, "mp3")
    if fmt not in FORMATS:
        raise BadRequest("invalid_format", f"response_format {fmt!r} is not supported; use one of "
                         f"{', '.join(FORMATS)}")
    speed = field_of(body, "speed", (int, float), 1.0)
    if not 0.25 <= speed <= 4.0:
        raise BadRequest("invalid_request", "speed must be between 0.25 and 4.0")
    stream = field_of(body, "stream", bool, False)
    stream_format = field_of(body, "stream_format", str, "audio")
    if stream_format not in ("audio", "sse"):
        raise BadRequest("invalid_request", "stream_format must be 'audio' or 'sse'")
    if field_of(body, "non_streaming_mode", bool, False):
        raise BadRequest("unsupported", "non_streaming_mode=true is not supported: talkgate feeds text to "
                         "the model as it arrives (non_streaming_mode=false)")
    field_of(body, "model", str)
    fixed = field_of(body, "fixed_frames", int)
    seed = field_of(body, "seed", int)
    encoding, rate, _ = FORMATS[fmt]
    cfg = ContextConfig(voice=field_of(body, "voice", str), language=field_of(body, "language", str, "auto"),
                        instructions=field_of(body, "instructions", str), format=AudioFormat(encoding, rate, streaming=stream),
                        sampling=SamplingParams(seed=seed), fixed_frames=fixed, speed=float(speed))
    return text, cfg, fmt, stream, stream_format


async def speech(request: web.Request) -> web.StreamResponse:
    gw = request.app["gateway"]
    if not gw.authorized(request):
        return _error(401, "unauthorized", "a valid API key is required")
    if gw.draining:
        return _error(503, "shutting_down", "the server is shutting down")
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        return _error(400, "invalid_json", "the body is not valid JSON")
    try:
        text, cfg, fmt, stream, stream_format = parse_request(body, gw.limits.max_http_input_chars)
    except BadRequest as e:
        return _error(400, e.code, e.message)

    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()    # bounded by the context's own length
    session = None
    try:
        session = gw.new_session(lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev), "openai", cfg)
        session.start(CONTEXT)
        session.append(CONTEXT, text)
        session.flush(CONTEXT)
    except SessionError as e:
        if session is not None:
            session.close()
        status = 503 if e.code == "engine_full" else 400
        return _error(status, e.code, e.message)

    content_type = FORMATS[fmt][2]
    response: web.StreamResponse | None = None
    whole: list[bytes] = []
    try:
        if stream:
            response = web.StreamResponse(headers={
                "Content-Type": "text/event-stream" if stream_format == "sse" else content_type,
                "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            await response.prepare(request)
        while True:
            out = session.on_engine_event(await _next_event(events, request))
            for ev in out:
                if isinstance(ev, AudioOut):
                    if response is None:
                        whole.append(ev.payload)
                    elif stream_format == "sse":
                        await response.write(_sse({"type": "speech.audio.delta",
                                                   "audio": base64.b64encode(ev.payload).decode()}))
                    else:
                        await response.write(ev.payload)
                    session.note_sent(ev.stream, ev.duration_ms)
                elif isinstance(ev, ContextError):
                    if response is None:
                        return _error(500, ev.code, ev.message)
                    if stream_format == "sse":
                        await response.write(_sse({"type": "error", "code": ev.code, "message": ev.message}))
                    return response     # a truncated chunked body: the client sees the stream end early
                elif isinstance(ev, ContextFinished):
                    if response is None:
                        return web.Response(body=b"".join(whole), content_type=content_type)
                    if stream_format == "sse":
                        await response.write(_sse({"type": "speech.audio.done", "usage": {
                            "input_tokens": len(text), "output_audio_ms": ev.audio_ms, "frames": ev.frames}}))
                    await response.write_eof()
                    return response
    finally:
        session.close()     # disconnect or error: free the engine slot (no-op when finished)


async def _next_event(events: asyncio.Queue, request: web.Request):
    """The next engine event; raises ConnectionResetError when the client has gone away meanwhile."""
    while True:
        try:
            return await asyncio.wait_for(events.get(), timeout=0.25)
        except asyncio.TimeoutError:
            if request.transport is None or request.transport.is_closing():
                raise ConnectionResetError("client disconnected") from None


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def voices(request: web.Request) -> web.Response:
    gw = request.app["gateway"]
    if not gw.authorized(request):
        return _error(401, "unauthorized", "a valid API key is required")
    info = gw.engine.info
    return web.json_response({"voices": [{"id": v, "name": v} for v in info.voices],
                              "languages": list(info.languages), "model": info.as_dict()})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/voices", voices)
