"""OpenAI `POST /v1/audio/speech`, Sans-I/O, onto `Session`: the request's input is one context, its
audio the response.

`parse_request(body)` checks the JSON body; `SpeechProtocol(session, request).start()` opens the
context and returns the first actions. Beside the wire actions (sessions/actions.py: Send a body chunk,
Close ends the body: code 1000 normally, any other code breaks the connection so the client sees a
truncated chunked body; engine commands) it returns `Begin` (a streamed 200 response's headers, sent
with the first audio, so that a context the engine refuses is still an error status) and `Respond`
(the whole response at once: a non-streamed file, or an error before any audio).

Streaming (`stream: true`): `stream_format: "audio"` writes the encoded audio as a chunked body as it
is generated (PCM: raw s16le 24 kHz, `audio/pcm`); `"sse"` sends `speech.audio.delta` events with
base64 audio and a final `speech.audio.done`. Otherwise the whole file comes at the end.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from talkgate.sessions.actions import ENGINE_COMMANDS, Close, Send, close_code, http_status
from talkgate.sessions.fields import SessionError, field_of, integer, number, show
from talkgate.sessions.session import (
    AudioFormat, AudioOut, ContextConfig, ContextError, ContextFinished, Session,
)
from talkgate.synth.api import SEED_RANGE, EngineEvent, SamplingParams, seed_fits

# response_format -> (session encoding, sample rate, content type)
FORMATS = {
    "pcm": ("pcm_s16le", 24000, "audio/pcm"),
    "wav": ("wav", 24000, "audio/wav"),
    "mp3": ("mp3", 24000, "audio/mpeg"),
    "opus": ("ogg_opus", 24000, "audio/ogg"),   # players decode Ogg/Opus at 48 kHz whatever the input rate
    "flac": ("flac", 24000, "audio/flac"),
}
CONTEXT = "speech"


@dataclass(frozen=True)
class Begin:
    content_type: str


@dataclass(frozen=True)
class Respond:
    status: int
    content_type: str
    body: bytes
    error: str | None = None


def error_body(status: int, code: str, message: str) -> bytes:
    """Every HTTP error of talkgate has this shape (OpenAI's)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


def error_response(status: int, code: str, message: str) -> Respond:
    return Respond(status, "application/json", error_body(status, code, message), error=code)


@dataclass(frozen=True)
class SpeechRequest:
    text: str
    config: ContextConfig
    response_format: str
    stream: bool
    stream_format: str


def parse_request(body: object, max_chars: int) -> SpeechRequest:
    """The JSON body -> SpeechRequest; raises SessionError (codes as OpenAI's: invalid_request, ...)."""
    try:
        return _parse(body, max_chars)
    except SessionError as e:
        if e.code in ("invalid_message", "invalid_params"):    # a missing or mistyped field
            raise SessionError("invalid_request", e.message) from None
        raise


def _parse(body: object, max_chars: int) -> SpeechRequest:
    if not isinstance(body, dict):
        raise SessionError("invalid_request", "the body must be a JSON object")
    text = field_of(body, "input", str, required=True)
    if not text.strip():
        raise SessionError("invalid_request", "input is empty")
    if len(text) > max_chars:
        raise SessionError("text_too_long", f"input is limited to {max_chars} characters")
    fmt = field_of(body, "response_format", str, "mp3")
    if fmt not in FORMATS:
        raise SessionError("invalid_format", f"response_format {show(fmt)} is not supported; use one of "
                           f"{', '.join(FORMATS)}")
    speed = number(body, "speed", 0.25, 4.0, 1.0)
    stream = field_of(body, "stream", bool, False)
    stream_format = field_of(body, "stream_format", str, "audio")
    if stream_format not in ("audio", "sse"):
        raise SessionError("invalid_request", "stream_format must be 'audio' or 'sse'")
    if field_of(body, "non_streaming_mode", bool, False):
        raise SessionError("unsupported", "non_streaming_mode=true is not supported: talkgate feeds text to "
                           "the model as it arrives (non_streaming_mode=false)")
    field_of(body, "model", str)
    fixed = integer(body, "fixed_frames", 1, 100_000)
    seed = field_of(body, "seed", int)
    if seed is not None and not seed_fits(seed):
        raise SessionError("invalid_request", f"seed must fit in 64 bits ({SEED_RANGE})")
    encoding, rate, _ = FORMATS[fmt]
    cfg = ContextConfig(voice=field_of(body, "voice", str), language=field_of(body, "language", str, "auto"),
                        instructions=field_of(body, "instructions", str),
                        format=AudioFormat(encoding, rate, streaming=stream),
                        sampling=SamplingParams(seed=seed), fixed_frames=fixed, speed=speed)
    return SpeechRequest(text, cfg, fmt, stream, stream_format)


class SpeechProtocol:
    idle_timeout_s: float | None = None

    def __init__(self, session: Session, request: SpeechRequest):
        self.session, self.request = session, request
        self.sse = request.stream and request.stream_format == "sse"
        self.content_type = FORMATS[request.response_format][2]
        self.whole: list[bytes] = []        # the file, when not streamed
        self.begun = False

    def start(self) -> list:
        events: list = []
        try:
            events += self.session.start(CONTEXT)
            events += self.session.append(CONTEXT, self.request.text)
            if self.session.has(CONTEXT):
                events += self.session.flush(CONTEXT)
        except SessionError as e:
            return self._wire(events) + [error_response(http_status(e.code), e.code, e.message)] + self.session.close()
        return self._wire(events)

    def engine_event(self, ev: EngineEvent) -> list:
        return self._wire(self.session.on_engine_event(ev))

    def note_sent(self, stream: int, audio_ms: float) -> None:
        self.session.note_sent(stream, audio_ms)

    def note_delivered(self, stream: int, audio_ms: float) -> None:
        self.session.note_delivered(stream, audio_ms)

    def tick(self) -> list:
        return self._wire(self.session.slow_consumers())

    def idle_timeout(self) -> list:
        return self.abort("idle_timeout", "no audio taken for the idle timeout", 1000)

    def abort(self, code: str, message: str, ws_code: int) -> list:
        return self._failed(code, message) + self.session.close()

    def connection_lost(self) -> list:
        return self.session.close()

    def _begin(self) -> list:
        if self.begun or not self.request.stream:
            return []
        self.begun = True
        return [Begin("text/event-stream" if self.sse else self.content_type)]

    def _wire(self, events) -> list:
        out: list = []
        for ev in events:
            if isinstance(ev, ENGINE_COMMANDS):    # passed through to the I/O layer, in order
                out.append(ev)
                continue
            if isinstance(ev, AudioOut):
                if not self.request.stream:     # kept for the response: taken, as far as the backlog goes
                    self.whole.append(ev.payload)
                    self.session.note_delivered(ev.stream, ev.duration_ms)
                elif self.sse:
                    out += self._begin()
                    out.append(Send(_sse({"type": "speech.audio.delta", "audio": base64.b64encode(ev.payload).decode()}),
                                    ev.stream, ev.duration_ms))
                else:
                    out += self._begin()
                    out.append(Send(ev.payload, ev.stream, ev.duration_ms))
            elif isinstance(ev, ContextError):
                out += self._failed(ev.code, ev.message)
            elif isinstance(ev, ContextFinished):
                if not self.request.stream:
                    out.append(Respond(200, self.content_type, b"".join(self.whole)))
                    continue
                out += self._begin()
                if self.sse:
                    out.append(Send(_sse({"type": "speech.audio.done", "usage": {
                        "input_tokens": len(self.request.text), "output_audio_ms": ev.audio_ms,
                        "frames": ev.frames}})))
                out.append(Close(1000, "done"))
        return out

    def _failed(self, code: str, message: str) -> list:
        if not self.begun:
            self.begun = True           # nothing more is sent: this is the answer
            return [error_response(http_status(code), code, message)]
        if self.sse:
            return [Send(_sse({"type": "error", "code": code, "message": message}), error=code), Close(1000, code)]
        return [Close(close_code(code), code, error=code)]     # not 1000: a truncated body, the client sees it


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()
