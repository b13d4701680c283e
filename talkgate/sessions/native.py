"""The native WebSocket protocol (docs/protocol.md), Sans-I/O, as a translator onto `Session`.

Feed it client frames (`receive_text`, `receive_binary`) and engine events (`engine_event`); it
returns actions for the I/O layer: `Send` (a text or binary frame; audio frames name their stream
and duration so the sender can account for what was really written), `Purge` (drop the queued,
unsent frames of a stream: a cancel happened) and `Close`. It never raises on client input.
"""
from __future__ import annotations

import base64
import json
import re
import struct
from dataclasses import dataclass
from typing import Callable

from talkgate.sessions.limits import Limits
from talkgate.sessions.session import (
    AudioFormat, AudioOut, ContextCancelled, ContextError, ContextFinished, ContextStarted, FirstAudio,
    Session, SessionError, SessionEvent, field_of,
)
from talkgate.synth.api import EngineEvent, SamplingParams


@dataclass(frozen=True)
class Send:
    data: str | bytes
    stream: int | None = None      # audio frames: the context's stream
    audio_ms: float = 0.0


@dataclass(frozen=True)
class Purge:
    stream: int


@dataclass(frozen=True)
class Close:
    code: int
    reason: str


Action = Send | Purge | Close

AUDIO_HEADER = struct.Struct("<BBHIII")   # version, encoding, reserved, stream, seq, start_ms
ENCODING_CODES = {"opus": 1, "pcm_s16le": 2, "pcm_f32le": 3, "mulaw": 4, "alaw": 5}
CONTEXT_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,64}\Z")
CLIENT_TYPES = ("session.config", "context.start", "text", "flush", "cancel", "ping", "close", "auth")
_SAMPLING_FIELDS = {"greedy": bool, "temperature": (int, float), "top_k": int, "top_p": (int, float),
                    "repetition_penalty": (int, float), "seed": int}


def send_json(obj: dict) -> Send:
    """A compact JSON text frame (every translator's JSON messages go out through this)."""
    return Send(json.dumps(obj, separators=(",", ":")))


def error(code: str, message: str, context_id: str | None = None, fatal: bool = False) -> Send:
    msg = {"type": "error", "code": code, "message": message}
    if context_id is not None:
        msg["context_id"] = context_id
        msg["fatal"] = fatal
    return send_json(msg)


class NativeProtocol:
    def __init__(self, session: Session, limits: Limits, session_id: str,
                 authenticate: Callable[[str], bool] | None = None):
        """`authenticate`: when set, the connection is not yet authenticated and the first message
        must be {"type": "auth", "api_key": ...} for which it returns True."""
        self.session, self.limits, self.session_id = session, limits, session_id
        self.authenticate = authenticate
        self.audio_transport = "binary"
        self.closing = False       # a `close` arrived: close once the last context is over

    # ----- connection -----
    def ready(self) -> list[Action]:
        if self.authenticate is not None:
            return []
        return [send_json({"type": "session.ready", "session_id": self.session_id,
                       "model": self.session.engine.info.as_dict(), "limits": self.limits.as_dict(),
                       "config": self._config_dict()})]

    def _config_dict(self) -> dict:
        d = self.session.defaults
        return {"voice": d.voice, "language": d.language, "instructions": d.instructions, "speed": d.speed,
                "format": {"encoding": d.format.encoding, "sample_rate": d.format.sample_rate},
                "sampling": {k: getattr(d.sampling, k) for k in _SAMPLING_FIELDS},
                "audio_transport": self.audio_transport}

    # ----- client frames -----
    def receive_binary(self, data: bytes) -> list[Action]:
        return [error("binary_not_allowed", "binary frames are not accepted: send JSON text messages")]

    def receive_text(self, data: str) -> list[Action]:
        if len(data.encode()) > self.limits.max_message_bytes:
            return [error("message_too_large", f"message over {self.limits.max_message_bytes} bytes")]
        try:
            msg = json.loads(data)
        except ValueError as e:
            return [error("invalid_json", f"message is not valid JSON: {e}")]
        if not isinstance(msg, dict):
            return [error("invalid_message", "a message must be a JSON object")]
        kind = msg.get("type")
        if kind not in CLIENT_TYPES:
            return [error("unknown_type", f"unknown message type {kind!r}; expected one of {', '.join(CLIENT_TYPES)}")]
        if self.authenticate is not None:
            if kind != "auth" or not isinstance(msg.get("api_key"), str) or not self.authenticate(msg["api_key"]):
                return [error("unauthorized", "a valid API key is required"), Close(1008, "unauthorized")]
            self.authenticate = None
            return self.ready()
        try:
            return getattr(self, "_on_" + kind.replace(".", "_"))(msg)
        except SessionError as e:
            self.session.observer.error(e.code)
            return [error(e.code, e.message, e.context_id, fatal=False)]

    def _on_auth(self, msg: dict) -> list[Action]:
        return [error("invalid_message", "already authenticated")]

    def _on_ping(self, msg: dict) -> list[Action]:
        reply = {"type": "pong"}
        if "id" in msg:
            reply["id"] = msg["id"]
        return [send_json(reply)]

    def _on_session_config(self, msg: dict) -> list[Action]:
        overrides = self._overrides(msg, None)
        transport = msg.get("audio_transport", self.audio_transport)
        if transport not in ("binary", "base64"):
            raise SessionError("invalid_message", "audio_transport must be 'binary' or 'base64'")
        self.session.configure(**overrides)
        self.audio_transport = transport
        return [send_json({"type": "session.configured", "config": self._config_dict()})]

    def _on_context_start(self, msg: dict) -> list[Action]:
        cid = self._context_id(msg)
        overrides = self._overrides(msg, cid)
        if "fixed_frames" in msg:
            overrides["fixed_frames"] = field_of(msg, "fixed_frames", int, context_id=cid, required=True)
        return self._wire(self.session.start(cid, **overrides))

    def _on_text(self, msg: dict) -> list[Action]:
        cid = self._context_id(msg)
        text = field_of(msg, "text", str, context_id=cid, required=True)
        return self._wire(self.session.append(cid, text))

    def _on_flush(self, msg: dict) -> list[Action]:
        return self._wire(self.session.flush(self._context_id(msg)))

    def _on_cancel(self, msg: dict) -> list[Action]:
        cid = self._context_id(msg) if msg.get("context_id") is not None else None
        return self._wire(self.session.cancel(cid))

    def _on_close(self, msg: dict) -> list[Action]:
        self.closing = True
        for cid in self.session.active:
            self.session.flush(cid)
        return self._maybe_close()

    def _maybe_close(self) -> list[Action]:
        return [Close(1000, "closed by client")] if self.closing and not self.session.active else []

    # ----- engine events -----
    def engine_event(self, ev: EngineEvent) -> list[Action]:
        return self._wire(self.session.on_engine_event(ev))

    def note_sent(self, stream: int, audio_ms: float) -> None:
        self.session.note_sent(stream, audio_ms)

    def idle_timeout(self) -> list[Action]:
        """No client message for the idle timeout: close, unless audio is still being produced."""
        if self.session.active:
            return []
        return [error("idle_timeout", f"no message for {self.limits.idle_timeout_s:g} s: closing"),
                Close(1000, "idle timeout")]

    def connection_lost(self) -> None:
        self.session.close()

    # ----- session events -> wire -----
    def _wire(self, events: list[SessionEvent]) -> list[Action]:
        out: list[Action] = []
        for ev in events:
            if isinstance(ev, AudioOut):
                out.append(self._audio(ev))
            elif isinstance(ev, ContextStarted):
                out.append(send_json({"type": "context.started", "context_id": ev.context_id, "stream": ev.stream,
                                  "format": {"encoding": ev.format.encoding, "sample_rate": ev.format.sample_rate}}))
            elif isinstance(ev, FirstAudio):
                out.append(send_json({"type": "timing", "context_id": ev.context_id, "ttfa_ms": ev.ttfa_ms,
                                  "frames": ev.frames, "audio_ms": ev.audio_ms}))
            elif isinstance(ev, ContextFinished):
                out.append(send_json({"type": "context.done", "context_id": ev.context_id, "reason": ev.reason,
                                  "frames": ev.frames, "audio_ms": ev.audio_ms, "ttfa_ms": ev.ttfa_ms}))
            elif isinstance(ev, ContextCancelled):
                out += [Purge(ev.stream), send_json({"type": "context.cancelled", "context_id": ev.context_id,
                                                 "audio_ms_sent": ev.audio_ms_sent})]
            elif isinstance(ev, ContextError):
                if ev.stream is not None:
                    out.append(Purge(ev.stream))
                out.append(error(ev.code, ev.message, ev.context_id, ev.fatal))
        return out + self._maybe_close()

    def _audio(self, ev: AudioOut) -> Send:
        if self.audio_transport == "base64":
            return Send(json.dumps({"type": "audio", "context_id": ev.context_id, "seq": ev.seq,
                                    "audio_ms": ev.duration_ms, "data": base64.b64encode(ev.payload).decode()}),
                        ev.stream, ev.duration_ms)
        header = AUDIO_HEADER.pack(1, ENCODING_CODES[ev.encoding], 0, ev.stream, ev.seq, int(ev.start_ms))
        return Send(header + ev.payload, ev.stream, ev.duration_ms)

    # ----- field parsing -----
    def _context_id(self, msg: dict) -> str:
        cid = msg.get("context_id")
        if not isinstance(cid, str) or not CONTEXT_ID.match(cid):
            raise SessionError("invalid_message", "context_id must be 1-64 characters of A-Z a-z 0-9 _ . : -")
        return cid

    def _overrides(self, msg: dict, cid: str | None) -> dict:
        o: dict = {}
        for name in ("voice", "instructions"):
            if msg.get(name) is not None:
                o[name] = field_of(msg, name, str, context_id=cid, required=True)
        if msg.get("language") is not None:
            o["language"] = field_of(msg, "language", str, context_id=cid, required=True)
        if msg.get("speed") is not None:
            o["speed"] = float(field_of(msg, "speed", (int, float), context_id=cid))
        if "format" in msg:
            fmt = field_of(msg, "format", dict, context_id=cid, required=True)
            enc, rate = fmt.get("encoding", "pcm_s16le"), fmt.get("sample_rate", 24000)
            if not isinstance(enc, str) or not isinstance(rate, int) or isinstance(rate, bool):
                raise SessionError("invalid_format", "format needs encoding (string) and sample_rate (integer)", cid)
            o["format"] = AudioFormat(enc, rate)
        if "sampling" in msg:
            s = field_of(msg, "sampling", dict, context_id=cid, required=True)
            for k, v in s.items():
                t = _SAMPLING_FIELDS.get(k)
                if t is None:
                    raise SessionError("invalid_params", f"unknown sampling field {k!r}", cid)
                if v is not None and (not isinstance(v, t) or (isinstance(v, bool) and t is not bool)):
                    raise SessionError("invalid_params", f"sampling.{k} has the wrong type", cid)
            _check_sampling(s, cid)
            o["sampling"] = SamplingParams(**s)
        return o


def _check_sampling(s: dict, cid: str | None) -> None:
    bad = ((s.get("temperature") is not None and not 0 < s["temperature"] <= 5, "temperature must be in (0, 5]"),
           (s.get("top_k") is not None and not 0 <= s["top_k"] <= 3072, "top_k must be in [0, 3072]"),
           (s.get("top_p") is not None and not 0 < s["top_p"] <= 1, "top_p must be in (0, 1]"),
           (s.get("repetition_penalty") is not None and not 0.5 <= s["repetition_penalty"] <= 2,
            "repetition_penalty must be in [0.5, 2]"))
    for is_bad, message in bad:
        if is_bad:
            raise SessionError("invalid_params", message, cid)
