"""The native WebSocket protocol (docs/protocol.md), Sans-I/O, as a translator onto `Session`.

Feed it client frames (`receive_text`, `receive_binary`) and engine events (`engine_event`); it
returns actions for the I/O layer (sessions/actions.py: Send, Purge, Close), and its session's engine commands
wait for `engine_commands()` (sessions/protocol.py). A client mistake is an
`error` event; it never raises on client input (an exception is a bug: the I/O layer's funnel turns
it into `abort`).
"""
from __future__ import annotations

import base64
import re
import struct
from typing import Callable

from talkgate.codecs import ENCODINGS
from talkgate.sessions.actions import Action, Close, Purge, Send, dumps, send_json
from talkgate.sessions.fields import SessionError, field_of, integer, load_message, number, show
from talkgate.sessions.limits import Limits
from talkgate.sessions.protocol import SocketProtocol
from talkgate.sessions.voices import VoiceScope
from talkgate.sessions.reference_audio import check_ref_text, decode_inline, read_clip
from talkgate.sessions.session import (
    AudioFormat, AudioOut, ContextCancelled, ContextError, ContextFinished, ContextStarted, FirstAudio,
    Reference, Session, SessionEvent,
)
from talkgate.synth.api import SEED_RANGE, EngineEvent, SamplingParams, seed_fits

AUDIO_HEADER = struct.Struct("<BBHIII")   # version, encoding, reserved, stream, seq, start_ms
# what the binary transport carries (a code per encoding in its header), with the rates each takes
ENCODING_CODES = {"opus": 1, "pcm_s16le": 2, "pcm_f32le": 3, "mulaw": 4, "alaw": 5}
FORMATS = {enc: ENCODINGS[enc][0] for enc in ENCODING_CODES}
CONTEXT_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,64}\Z")
CLIENT_TYPES = ("session.config", "context.start", "text", "flush", "cancel", "ping", "close", "auth")
_SAMPLING_FIELDS = {"greedy": bool, "temperature": (int, float), "top_k": int, "top_p": (int, float),
                    "repetition_penalty": (int, float), "seed": int}
_FORMAT_FIELDS = ("encoding", "sample_rate")


def error(code: str, message: str, context_id: str | None = None, fatal: bool = False) -> Send:
    msg = {"type": "error", "code": code, "message": message}
    if context_id is not None:
        msg["context_id"] = context_id
        msg["fatal"] = fatal
    return send_json(msg, error=code)


def parse_format(fmt: object, cid: str | None) -> AudioFormat:
    """A native `format` object -> AudioFormat; only what the binary header can name (FORMATS)."""
    if not isinstance(fmt, dict):
        raise SessionError("invalid_format", "format must be an object with encoding and sample_rate", cid)
    unknown = [k for k in fmt if k not in _FORMAT_FIELDS]
    if unknown:
        raise SessionError("invalid_format", f"unknown format field {show(unknown[0])}; format has encoding "
                           "and sample_rate", cid)
    enc, rate = fmt.get("encoding", "pcm_s16le"), fmt.get("sample_rate", 24000)
    if not isinstance(enc, str) or enc not in FORMATS:
        raise SessionError("invalid_format", f"encoding {show(enc)} is not supported: use "
                           f"{', '.join(FORMATS)}", cid)
    if not isinstance(rate, int) or isinstance(rate, bool) or rate not in FORMATS[enc]:   # 44100.0 is not a rate
        raise SessionError("invalid_format", f"{enc} takes sample_rate {', '.join(map(str, FORMATS[enc]))}, "
                           f"not {show(rate)}", cid)
    return AudioFormat(enc, rate)


class NativeProtocol(SocketProtocol):
    def __init__(self, session: Session, limits: Limits, session_id: str,
                 authenticate: Callable[[str], VoiceScope | None] | None = None):
        """`authenticate`: when set, the connection is not yet authenticated and the first message
        must be {"type": "auth", "api_key": ...} for which it returns the client's voices (not None)."""
        self.session, self.limits, self.session_id = session, limits, session_id
        self.authenticate = authenticate
        self.audio_transport = "binary"
        self.closing = False       # a `close` arrived: close once the last context is over

    # ----- connection -----
    def ready(self) -> list[Action]:
        if self.authenticate is not None:
            return []
        return [send_json({"type": "session.ready", "session_id": self.session_id,
                       "model": self.session.info.as_dict(), "models": self.session.models.listing,
                       "limits": self.limits.as_dict(),
                       "config": self._config_dict()})]

    def _config_dict(self) -> dict:
        d = self.session.defaults
        return {"voice": d.voice, "language": d.language, "instructions": d.instructions, "speed": d.speed,
                "format": {"encoding": d.format.encoding, "sample_rate": d.format.sample_rate},
                "sampling": {k: getattr(d.sampling, k) for k in _SAMPLING_FIELDS},
                "audio_transport": self.audio_transport}

    # ----- client frames -----
    def receive_binary(self, data: bytes) -> list[Action]:
        if self.authenticate is not None:
            return self._unauthorized()
        return [error("binary_not_allowed", "binary frames are not accepted: send JSON text messages")]

    def receive_text(self, data: str) -> list[Action]:
        try:
            msg = load_message(data, self.limits.max_message_bytes)
            kind = msg.get("type")
            if self.authenticate is not None:
                return self._auth(msg)
            if kind not in CLIENT_TYPES:
                raise SessionError("unknown_type", f"unknown message type {show(kind)}; expected one of "
                                   f"{', '.join(CLIENT_TYPES)}")
            return getattr(self, "_on_" + kind.replace(".", "_"))(msg)
        except SessionError as e:
            if self.authenticate is not None:
                return self._unauthorized()
            return [error(e.code, e.message, e.context_id, fatal=False)]

    def _auth(self, msg: dict) -> list[Action]:
        """The first message of a connection that must authenticate: a valid auth, or it closes."""
        key = msg.get("api_key")
        scope = self.authenticate(key) if msg.get("type") == "auth" and isinstance(key, str) else None
        if scope is None:
            return self._unauthorized()
        self.authenticate = None
        self.session.voices = scope.voices
        return self.ready()

    def _unauthorized(self) -> list[Action]:
        return [error("unauthorized", "a valid API key is required"), Close(1008, "unauthorized")]

    def _on_auth(self, msg: dict) -> list[Action]:
        return [error("invalid_message", "already authenticated")]

    def _on_ping(self, msg: dict) -> list[Action]:
        reply = {"type": "pong"}
        ping_id = field_of(msg, "id", (str, int, float))
        if ping_id is not None:
            reply["id"] = ping_id
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
            overrides["fixed_frames"] = integer(msg, "fixed_frames", 1, 100_000, context_id=cid)
        if msg.get("ref_audio") is not None or msg.get("ref_text") is not None:
            if "voice" in overrides:
                raise SessionError("invalid_params", "give a voice or reference audio (ref_audio), not both", cid)
            overrides["reference"] = self._reference(msg, cid)
        return self._wire(self.session.start(cid, **overrides))

    def _reference(self, msg: dict, cid: str) -> Reference:
        """A context's own reference audio: `ref_audio` (a data URL or base64 of a WAV/FLAC/Ogg/MP3 file that
        fits the message limit) and optional `ref_text`, the words spoken in it. Decoded here, on the event
        loop: at most max_message_bytes of it."""
        if msg.get("ref_audio") is None:
            raise SessionError("invalid_params", "ref_text needs ref_audio, the audio whose words it is", cid)
        try:
            ref_text = check_ref_text(msg.get("ref_text"))
            clip = read_clip(decode_inline(msg["ref_audio"], self.limits.max_message_bytes), "ref_audio")
        except SessionError as e:
            raise SessionError(e.code, e.message, cid) from None
        return Reference(clip.samples.tobytes(), ref_text)

    def _on_text(self, msg: dict) -> list[Action]:
        """A text delta: `text`, or `ids` (token ids of Qwen's tokenizer, from a client whose LLM speaks it)."""
        cid = self._context_id(msg)
        if msg.get("ids") is None:
            return self._wire(self.session.append(cid, field_of(msg, "text", str, context_id=cid, required=True)))
        if msg.get("text") is not None:
            raise SessionError("invalid_message", "a text message carries text or ids, not both", cid)
        ids = field_of(msg, "ids", list, context_id=cid)
        if not all(type(i) is int for i in ids):
            raise SessionError("invalid_message", "field 'ids' holds integers only (token ids)", cid)
        return self._wire(self.session.append_ids(cid, ids))

    def _on_flush(self, msg: dict) -> list[Action]:
        return self._wire(self.session.end_text(self._context_id(msg)))

    def _on_cancel(self, msg: dict) -> list[Action]:
        cid = self._context_id(msg) if msg.get("context_id") is not None else None
        return self._wire(self.session.cancel(cid))

    def _on_close(self, msg: dict) -> list[Action]:
        self.closing = True
        self.session.accepting = False
        events = []
        for cid in self.session.active:
            events += self.session.end_text(cid)
        return self._wire(events)

    def _maybe_close(self) -> list[Action]:
        return [Close(1000, "closed by client")] if self.closing and not self.session.active else []

    # ----- engine events, time, the end -----
    def engine_event(self, ev: EngineEvent) -> list[Action]:
        return self._wire(self.session.on_engine_event(ev))

    def tick(self) -> list[Action]:
        return self._wire(self.session.tick() + self.session.slow_consumers())

    def idle_timeout(self) -> list[Action]:
        self.session.close()
        return [error("idle_timeout", f"nothing sent or read for {self.limits.idle_timeout_s:g} s: closing"),
                Close(1000, "idle timeout")]

    def abort(self, code: str, message: str, ws_code: int) -> list[Action]:
        self.session.close()
        return [error(code, message), Close(ws_code, code)]

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
            return Send(dumps({"type": "audio", "context_id": ev.context_id, "seq": ev.seq,
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
        for name in ("voice", "instructions", "language", "model"):
            if msg.get(name) is not None:
                o[name] = field_of(msg, name, str, context_id=cid, required=True)
        if msg.get("speed") is not None:
            o["speed"] = number(msg, "speed", 0.25, 4.0, context_id=cid)
        if "format" in msg:
            o["format"] = parse_format(msg["format"], cid)
        if "sampling" in msg:
            o["sampling"] = parse_sampling(field_of(msg, "sampling", dict, context_id=cid, required=True), cid)
        return o


def parse_sampling(s: dict, cid: str | None) -> SamplingParams:
    for k, v in s.items():
        t = _SAMPLING_FIELDS.get(k)
        if t is None:
            raise SessionError("invalid_params", f"unknown sampling field {show(k)}", cid)
        if v is not None and (not isinstance(v, t) or (isinstance(v, bool) and t is not bool)):
            raise SessionError("invalid_params", f"sampling.{k} has the wrong type", cid)
    bad = ((s.get("temperature") is not None and not 0 < s["temperature"] <= 5, "temperature must be in (0, 5]"),
           (s.get("top_k") is not None and not 0 <= s["top_k"] <= 3072, "top_k must be in [0, 3072]"),
           (s.get("top_p") is not None and not 0 < s["top_p"] <= 1, "top_p must be in (0, 1]"),
           (s.get("repetition_penalty") is not None and not 0.5 <= s["repetition_penalty"] <= 2,
            "repetition_penalty must be in [0.5, 2]"),
           (s.get("seed") is not None and not seed_fits(s["seed"]), f"seed must fit in 64 bits ({SEED_RANGE})"))
    for is_bad, message in bad:
        if is_bad:
            raise SessionError("invalid_params", message, cid)
    return SamplingParams(**s)
