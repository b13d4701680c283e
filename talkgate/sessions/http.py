"""One HTTP request's text spoken as one session context, its audio the response: what every HTTP speech
endpoint shares (OpenAI `POST /v1/audio/speech`, ElevenLabs text-to-speech, Cartesia `/tts/bytes` and
`/tts/sse`, Deepgram `POST /v1/speak`). Sans-I/O, onto `Session`.

`HttpSpeech(session, text, streamed).start()` opens the context and returns the first actions; `speak()`, the next
call, appends its whole text and ends it. Two calls, so that the I/O layer hands the engine the open before the
text is tokenized: the engine opens the slot while the worker tokenizes (an idle engine's wake and slot open, ~0.9
ms on an H200 host, took their turn after the worker's parse and tokenization, ~0.35 ms). The engine commands of
each call wait for `engine_commands()` (sessions/protocol.py). Beside the wire actions (sessions/actions.py: Send
a body piece, Close ends the body: code 1000 normally, any other code breaks the connection so the client sees a
truncated chunked body) it returns `Begin` (a streamed 200 response's headers, sent with the first audio, so that
a context the engine refuses is still an error status) and `Respond` (the whole response at once: a body made at
the end, or an error before any audio).

A translator subclasses it and says how the body is framed (`body`, `end`, `whole`, `failed_body`) and
what its errors look like (`error`); the route (server/http_speech.py) parses the request into one.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from talkgate.sessions.actions import Close, Send, close_code, http_status
from talkgate.sessions.fields import SessionError
from talkgate.sessions.protocol import ClientProtocol
from talkgate.sessions.session import AudioOut, ContextError, ContextFinished, Session
from talkgate.synth.api import EngineEvent

CONTEXT = "speech"


@dataclass(frozen=True)
class Begin:
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Respond:
    status: int
    content_type: str
    body: bytes
    error: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    stream: int | None = None      # a body of audio: its context's stream and its duration (metered once written)
    audio_ms: float = 0.0


def new_request_id() -> str:
    """An id for one HTTP request, as the APIs whose answers name one (DashScope, Deepgram) make them."""
    return str(uuid.uuid4())


def error_body(status: int, code: str, message: str) -> bytes:
    """talkgate's own HTTP error shape (OpenAI's): every route that has no shape of its own uses it."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


def error_response(status: int, code: str, message: str) -> Respond:
    return Respond(status, "application/json", error_body(status, code, message), error=code)


def sse(obj: dict, event: str | None = None) -> bytes:
    """One server-sent event carrying a JSON object."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


class HttpSpeech(ClientProtocol):
    """The audio of `text` as one response: streamed as generated (`streamed`), or whole at the end."""

    content_type = "application/octet-stream"

    def __init__(self, session: Session, text: str, streamed: bool):
        self.session, self.text, self.streamed = session, text, streamed
        self.pieces: list[bytes] = []       # the body so far, when it is sent whole ...
        self.whole_stream: int | None = None    # ... and its audio's stream and duration
        self.whole_ms = 0.0
        self.request_id = new_request_id()
        self.begun = False

    # ----- what a translator says -----
    def headers(self) -> tuple[tuple[str, str], ...]:
        """Extra response headers (streamed or whole)."""
        return ()

    def body(self, ev: AudioOut) -> list[bytes]:
        """The body pieces carrying one chunk of audio."""
        return [ev.payload]

    def end(self, ev: ContextFinished) -> list[bytes]:
        """The body pieces after the last audio."""
        return []

    def whole(self, pieces: list[bytes]) -> bytes:
        """The body of a response sent at once, from every piece body() and end() made."""
        return b"".join(pieces)

    def failed_body(self, code: str, message: str) -> bytes | None:
        """What a streamed body says when it fails after it began (an in-band error event), or None:
        the connection is broken off and the client sees a truncated body."""
        return None

    def error(self, status: int, code: str, message: str) -> Respond:
        """An error response in the API's own shape (talkgate's by default)."""
        return error_response(status, code, message)

    # ----- the I/O layer's surface (sessions/protocol.py) -----
    def start(self) -> list:
        """Open the context (its OpenContext the call's engine command); the text follows in speak()."""
        try:
            return self._wire(self.session.start(CONTEXT))
        except SessionError as e:
            self.session.close()
            return [self.error(http_status(e.code), e.code, e.message)]

    def speak(self) -> list:
        """The whole text appended and ended (after start(); nothing where the context did not open or has ended)."""
        if not self.session.has(CONTEXT):
            return []
        try:
            return self._wire(self.session.whole_text(CONTEXT, self.text))
        except SessionError as e:
            self.session.close()
            return self._failed(e.code, e.message)

    def engine_event(self, ev: EngineEvent) -> list:
        return self._wire(self.session.on_engine_event(ev))

    def tick(self) -> list:
        return self._wire(self.session.tick() + self.session.slow_consumers())

    def idle_timeout(self) -> list:
        return self.abort("idle_timeout", "no audio taken for the idle timeout", 1000)

    def abort(self, code: str, message: str, ws_code: int) -> list:
        self.session.close()
        return self._failed(code, message)

    # ----- internals -----
    def _begin(self) -> list:
        if self.begun:
            return []
        self.begun = True
        return [Begin(self.content_type, self.headers())]

    def _wire(self, events) -> list:
        out: list = []
        for ev in events:
            if isinstance(ev, AudioOut):
                pieces = self.body(ev)
                if not self.streamed:           # kept for the response: taken, as far as the backlog goes
                    self.pieces += pieces
                    self.whole_stream, self.whole_ms = ev.stream, self.whole_ms + ev.duration_ms
                    self.session.note_delivered(ev.stream, ev.duration_ms)
                    continue
                out += self._begin()
                # the audio's duration rides on the first piece (the writer credits it once written)
                out += [Send(p, ev.stream, ev.duration_ms if i == 0 else 0.0) for i, p in enumerate(pieces)]
            elif isinstance(ev, ContextError):
                out += self._failed(ev.code, ev.message)
            elif isinstance(ev, ContextFinished):
                pieces = self.end(ev)
                if not self.streamed:
                    self.begun = True
                    out.append(Respond(200, self.content_type, self.whole(self.pieces + pieces),
                                       headers=self.headers(), stream=self.whole_stream, audio_ms=self.whole_ms))
                    continue
                out += self._begin()
                out += [Send(p) for p in pieces]
                out.append(Close(1000, "done"))
        return out

    def _failed(self, code: str, message: str) -> list:
        if not self.begun:
            self.begun = True           # nothing more is sent: this is the answer
            return [self.error(http_status(code), code, message)]
        data = self.failed_body(code, message)
        if data is not None:
            return [Send(data, error=code), Close(1000, code)]
        return [Close(close_code(code), code, error=code)]     # not 1000: a truncated body, the client sees it
