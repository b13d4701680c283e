"""Twilio Media Streams mode (`/v1/twilio?stream_sid=MZ...`): the native protocol in, Twilio frames out.

A telephony bridge holds two sockets: Twilio's Media Stream and this one. It sends talkgate the
native client messages (docs/protocol.md: text, flush, cancel...); talkgate answers with frames the
bridge forwards to Twilio unchanged (JSON with an "event" key):
  {"event":"media","streamSid":...,"media":{"payload":<base64 mu-law 8 kHz, exactly 160 bytes = 20 ms>}}
  {"event":"mark","streamSid":...,"mark":{"name":<context_id>}}    after a context's last audio
  {"event":"clear","streamSid":...}                                 a context that had audio out was cancelled
and the native JSON events (a "type" key: context.started, context.done, error...) for itself.

Twilio plays one stream, so contexts are played one after the other in the order they started:
the audio of a context started while another plays is held until that one is over (bounded by the
session's backlog limit). A context's last partial 20 ms frame is padded with mu-law silence.

This is a translator on top of `NativeProtocol` (same session, same messages), not a second one:
it re-frames NativeProtocol's binary audio frames and orders its per-context events.
"""
from __future__ import annotations

import base64
import json
from collections import deque
from dataclasses import dataclass, field

from talkgate.sessions.actions import Send, dumps
from talkgate.sessions.fields import SessionError, load_message
from talkgate.sessions.native import AUDIO_HEADER, NativeProtocol, error
from talkgate.sessions.protocol import SocketProtocol
from talkgate.sessions.session import AudioFormat

FRAME_BYTES = 160               # 20 ms of 8 kHz mu-law
FRAME_MS = 20.0
MULAW_SILENCE = b"\xff"
MULAW_8K = AudioFormat("mulaw", 8000)


@dataclass
class _Playback:
    context_id: str
    stream: int
    held: list = field(default_factory=list)    # actions waiting until this context plays
    rest: bytes = b""                           # audio short of a whole frame
    sent_audio: bool = False


class TwilioProtocol(SocketProtocol):
    def __init__(self, native: NativeProtocol, stream_sid: str):
        self.native, self.session, self.stream_sid = native, native.session, stream_sid
        native.audio_transport = "binary"
        self.session.configure(format=MULAW_8K)
        self.queue: deque[_Playback] = deque()      # head plays; the others are held
        self.by_id: dict[str, _Playback] = {}

    @property
    def idle_timeout_s(self):
        return self.native.idle_timeout_s

    # ----- the I/O layer's surface (sessions/protocol.py) -----
    def ready(self) -> list:
        return self._twilio(self.native.ready())

    def receive_text(self, data: str) -> list:
        try:
            msg = load_message(data, self.native.limits.max_message_bytes)
        except SessionError:
            msg = None      # NativeProtocol answers it itself
        if isinstance(msg, dict) and self.native.authenticate is None and ("format" in msg or "audio_transport" in msg):
            return [error("invalid_format", "the Twilio mode sends mu-law 8 kHz in media events: format and "
                          "audio_transport cannot be set", msg.get("context_id") if isinstance(
                              msg.get("context_id"), str) else None)]
        return self._twilio(self.native.receive_text(data))

    def receive_binary(self, data: bytes) -> list:
        return self._twilio(self.native.receive_binary(data))

    def engine_event(self, ev) -> list:
        return self._twilio(self.native.engine_event(ev))

    def tick(self) -> list:
        return self._twilio(self.native.tick())

    def idle_timeout(self) -> list:
        return self._twilio(self.native.idle_timeout())

    def abort(self, code: str, message: str, ws_code: int) -> list:
        return self.native.abort(code, message, ws_code)

    def connection_lost(self) -> list:
        return self.native.connection_lost()

    # ----- native actions -> Twilio frames, in play order -----
    def _twilio(self, actions: list) -> list:
        out: list = []
        for a in actions:
            if isinstance(a, Send) and isinstance(a.data, bytes):
                stream = AUDIO_HEADER.unpack_from(a.data)[3]
                pb = self._by_stream(stream)
                if pb is not None:
                    self._route(pb, ("audio", a.data[AUDIO_HEADER.size:]), out)
            elif isinstance(a, Send):
                self._event(a, json.loads(a.data), out)
            else:           # Purge (frames of a cancelled stream), Close
                out.append(a)
        return out

    def _event(self, a: Send, msg: dict, out: list) -> None:
        kind, cid = msg.get("type"), msg.get("context_id")
        if kind == "context.started":
            pb = _Playback(cid, msg["stream"])
            self.queue.append(pb)
            self.by_id[cid] = pb
            out.append(a)
        elif kind == "context.done" and cid in self.by_id:
            self._route(self.by_id[cid], ("done", a), out)
        elif cid in self.by_id and (kind == "context.cancelled" or (kind == "error" and msg.get("fatal"))):
            pb = self.by_id.pop(cid)
            playing = pb is self.queue[0]
            self.queue.remove(pb)
            if playing and pb.sent_audio:
                out.append(self._frame({"event": "clear"}))
            out.append(a)
            if playing:
                self._play_next(out)
        else:
            out.append(a)

    def _route(self, pb: _Playback, item: tuple, out: list) -> None:
        if pb is self.queue[0]:
            self._emit(pb, item, out)
        else:
            pb.held.append(item)

    def _emit(self, pb: _Playback, item: tuple, out: list) -> None:
        kind, value = item
        if kind == "audio":
            data = pb.rest + value
            whole = len(data) - len(data) % FRAME_BYTES
            pb.rest = data[whole:]
            for i in range(0, whole, FRAME_BYTES):
                out.append(self._media(pb, data[i:i + FRAME_BYTES]))
            return
        if pb.rest:     # the context is over: pad its last partial frame with silence
            out.append(self._media(pb, pb.rest + MULAW_SILENCE * (FRAME_BYTES - len(pb.rest))))
            pb.rest = b""
        out.append(self._frame({"event": "mark", "mark": {"name": pb.context_id}}))
        out.append(value)
        self.by_id.pop(pb.context_id, None)
        self.queue.popleft()
        self._play_next(out)

    def _play_next(self, out: list) -> None:
        if self.queue:
            pb = self.queue[0]
            held, pb.held = pb.held, []
            for item in held:       # its "done", if held, is the last item
                self._emit(pb, item, out)

    def _media(self, pb: _Playback, payload: bytes) -> Send:
        pb.sent_audio = True
        return Send(dumps({"event": "media", "streamSid": self.stream_sid,
                           "media": {"payload": base64.b64encode(payload).decode()}}), pb.stream, FRAME_MS)

    def _frame(self, obj: dict) -> Send:
        return Send(dumps({"event": obj.pop("event"), "streamSid": self.stream_sid, **obj}))

    def _by_stream(self, stream: int) -> _Playback | None:
        return next((pb for pb in self.queue if pb.stream == stream), None)

