"""Cartesia WebSocket TTS (`/tts/websocket`), Sans-I/O, onto `Session`.

A Cartesia context is one utterance (sessions/utterances.py): its generation requests' transcripts
concatenate verbatim; `continue: false` ends its input; `flush: true` speaks what came so far and is
answered with `flush_done` once that audio is out; `cancel` stops it at once (queued audio purged,
nothing more is sent for it). Every server message carries `context_id` and a `type`; after a
context's `done` nothing more is sent for it. Word timestamps are estimates (sessions/alignment.py).
"""
from __future__ import annotations

import base64

from talkgate.sessions.actions import BUSY, ENGINE_COMMANDS, Close, Send, dumps, http_status, send_json
from talkgate.sessions.fields import SessionError, field_of, show
from talkgate.sessions.session import AudioFormat, ContextCancelled, ContextError, Session
from talkgate.sessions.utterances import (
    Audio, Event, SegmentDone, UtteranceDone, UtteranceProtocol,
)
from talkgate.sessions.voices import UnknownVoice, VoiceMap, resolve_language

ENCODINGS = {"pcm_s16le": "pcm_s16le", "pcm_f32le": "pcm_f32le", "pcm_mulaw": "mulaw", "pcm_alaw": "alaw"}
PCM_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
STATUS = 206




def parse_output_format(fmt: object, cid: str) -> AudioFormat:
    if not isinstance(fmt, dict):
        raise SessionError("invalid_output_format", "output_format must be an object with container, encoding "
                           "and sample_rate", cid)
    container, enc, rate = fmt.get("container", "raw"), fmt.get("encoding"), fmt.get("sample_rate")
    if container != "raw":
        raise SessionError("invalid_output_format", f"container {show(container)} is not supported on the "
                           "WebSocket: use \"raw\"", cid)
    if not isinstance(enc, str) or enc not in ENCODINGS:
        raise SessionError("invalid_output_format", f"encoding {show(enc)} is not supported: use "
                           f"{', '.join(ENCODINGS)}", cid)
    rates = (8000,) if enc in ("pcm_mulaw", "pcm_alaw") else PCM_RATES
    if not isinstance(rate, int) or isinstance(rate, bool) or rate not in rates:
        raise SessionError("invalid_output_format", f"sample_rate {show(rate)} is not supported for {enc}: use "
                           f"{', '.join(map(str, rates))}", cid)
    return AudioFormat(ENCODINGS[enc], rate)


class CartesiaProtocol(UtteranceProtocol):
    def __init__(self, session: Session, session_id: str, voices: VoiceMap):
        super().__init__(session, session_id)
        self.voices = voices
        self.timestamps: dict[str, bool] = {}       # context -> add_timestamps
        self.flush_ids: dict[str, int] = {}         # context -> flushes so far

    def ready(self) -> list:
        return []

    def idle_timeout(self) -> list:
        """Idle for the server's idle timeout: close (Cartesia closes idle sockets too; clients reconnect)."""
        return [Close(1000, "idle timeout")] + self.utterances.close()

    def abort(self, code: str, message: str, ws_code: int) -> list:
        return [self._error(None, code, message), Close(ws_code, code)] + self.utterances.close()

    def receive_binary(self, data: bytes) -> list:
        return [self._error(None, "invalid_message", "binary frames are not accepted: send JSON text messages")]

    def receive_text(self, data: str) -> list:
        cid = None
        try:
            msg = self._parse(data)
            cid = msg.get("context_id") if isinstance(msg.get("context_id"), str) else None
            if cid is None or not cid:
                raise SessionError("invalid_message", "context_id (a non-empty string) is required")
            if field_of(msg, "cancel", bool, False, cid):
                return self._cancel(cid)
            return self._generate(cid, msg)
        except SessionError as e:
            # an error is `done: true`: a context it names is over, so nothing of it may follow
            stop = self._cancel(cid) if cid is not None else []
            return stop + [self._error(cid, e.code, e.message)]

    def _cancel(self, cid: str) -> list:
        if cid not in self.utterances:
            return []       # already done (or never started): nothing follows either way
        self.timestamps.pop(cid, None)
        self.flush_ids.pop(cid, None)
        return self._wire(self.utterances.cancel(cid)) + self._purges(cid)

    def _generate(self, cid: str, msg: dict) -> list:
        transcript = field_of(msg, "transcript", str, "", cid)
        cont = field_of(msg, "continue", bool, False, cid)
        flush = field_of(msg, "flush", bool, False, cid)
        add_timestamps = field_of(msg, "add_timestamps", bool, False, cid)
        if cid not in self.utterances:
            self.utterances.open(cid, **self._context_config(cid, msg))
            self.timestamps[cid] = add_timestamps
            self.flush_ids[cid] = 0
        events: list[Event] = []
        if transcript:
            events += self.utterances.append(cid, transcript)
        if cid in self.utterances and flush:
            self.flush_ids[cid] += 1
            events += self.utterances.flush(cid, tag=self.flush_ids[cid])
        if cid in self.utterances and not cont:
            events += self.utterances.end(cid)
        return self._wire(events)

    def _context_config(self, cid: str, msg: dict) -> dict:
        info = self.session.info
        voice = msg.get("voice")
        if isinstance(voice, dict) and voice.get("mode") == "embedding":
            raise SessionError("invalid_voice", "voice embeddings are not supported: use {\"mode\": \"id\"}", cid)
        if (not isinstance(voice, dict) or voice.get("mode", "id") != "id" or not isinstance(voice.get("id"), str)
                or not voice["id"]):
            raise SessionError("invalid_voice", "voice must be {\"mode\": \"id\", \"id\": \"<voice id>\"}", cid)
        try:
            name = self.voices.resolve("cartesia", voice["id"], info.voices)
        except UnknownVoice as e:
            raise SessionError("voice_not_found", str(e), cid) from None
        fmt = parse_output_format(msg.get("output_format"), cid)
        language = resolve_language(field_of(msg, "language", str, None, cid), info.languages)
        return {"voice": name, "format": fmt, "language": language}

    # ----- utterance events -> wire -----
    def _wire(self, events: list[Event]) -> list:
        out: list = []
        for ev in events:
            if isinstance(ev, ENGINE_COMMANDS):    # passed through to the I/O layer, in order
                out.append(ev)
                continue
            if isinstance(ev, Audio):
                out.append(self._audio_send(dumps(
                    {"type": "chunk", "data": base64.b64encode(ev.out.payload).decode(), "done": False,
                     "status_code": STATUS, "step_time": ev.out.duration_ms, "context_id": ev.key}),
                    ev.key, ev.out.stream, ev.out.duration_ms))
                out += self._words(ev.key, ev.words)
            elif isinstance(ev, SegmentDone):
                out += self._words(ev.key, ev.words)
                if ev.tag is not None:
                    out.append(send_json({"type": "flush_done", "done": False, "flush_done": True, "flush_id": ev.tag,
                                      "status_code": STATUS, "context_id": ev.key}))
            elif isinstance(ev, UtteranceDone):
                self.timestamps.pop(ev.key, None)
                self.flush_ids.pop(ev.key, None)
                out.append(send_json({"type": "done", "done": True, "status_code": STATUS, "context_id": ev.key}))
            elif isinstance(ev, ContextCancelled):
                out += self._purges(ev.context_id, ev.stream)
            elif isinstance(ev, ContextError):
                out += self._purges(ev.context_id, ev.stream)
                self.timestamps.pop(ev.context_id, None)
                self.flush_ids.pop(ev.context_id, None)
                out.append(self._error(ev.context_id, ev.code, ev.message))
        return out

    def _words(self, cid: str, words) -> list:
        if not words or not self.timestamps.get(cid):
            return []
        return [send_json({"type": "timestamps", "done": False, "status_code": STATUS, "context_id": cid,
                       "word_timestamps": {"words": [w.text for w in words], "start": [w.start_s for w in words],
                                           "end": [w.end_s for w in words]}})]

    def _error(self, cid: str | None, code: str, message: str) -> Send:
        """Cartesia's error message; its status_code is 500 only for the server's own failures."""
        status = 429 if code == BUSY else http_status(code)
        return send_json({"type": "error", "done": True, "title": code.replace("_", " ").capitalize(),
                          "message": message, "error_code": code, "status_code": status, "context_id": cid},
                         error=code)
